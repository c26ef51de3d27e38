"""Experiment trackers across attempts: a restarted run reads as one run.

Loaded only by the auto-attach bootstrap, when a job imports a tracker: a job that never does
loads nothing of this room. Every patch here fails open: an error costs one warning line, never
the training.

Modules:

    point               where this attempt stands: the step it resumed from and the first step it
                        logs (set by the raw loop and the callbacks; else read from the environment)
    tensorboard_writer  SummaryWriter (torch's, tensorboardX's): purge_step at a resume, and one
                        default log dir for all attempts
    lightning_logger    Lightning's TensorBoardLogger: the first attempt's version_N for all attempts
    mlflow_run          mlflow.start_run: the first attempt's run recorded in the run dir, each
                        resume tagged with its step
"""

"""The process around the loop: heartbeats, signals, hooks, collectives.

Private: users rely only on what `trainer_shim` exports.

    distributed  Solo (a world of one) and Dist: the same collectives
    heartbeat    the heartbeat file, written by a background thread
    hooks        the process hooks of one Run, installed and removed together
    messages     say: the shim's one stderr line
    signals      stop flag, stack dumps, fork tie, excepthook
"""

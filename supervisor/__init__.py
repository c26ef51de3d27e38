"""resilient-run supervisor: a torch-free daemon that keeps a training job alive."""

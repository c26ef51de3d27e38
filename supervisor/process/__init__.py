"""Process control: spawn, watch and stop the job's processes.

    attempts   Attempt (what runs) and AttemptResult (how it ended, assessed once)
    below      a trainer's death below a launcher (sh -c, swift, accelerate): the pid and signal
    cgroup     --memory-limit cgroups and the kernel's OOM-kill evidence
    faults     `drill`'s real faults: SIGKILL, SIGSTOP, an OOM kill inside the trainer's memory limit
    first_attempt  the run's first attempt; on a new node it starts during the mirror download
    heartbeat  per-rank liveness from file events and a timer, on our own clock
    launch     the torchrun argv; torchrun's per-rank failure records
    leftover   end a trainer whose supervisor died before a new attempt starts
    lock       the run dir's lock: one live supervisor per run dir (node)
    prestart   the next attempt's launcher (prestarted torchrun or warm interpreter)
    procs      spawn in its own group (die-with-parent), tee the log, kill whole trees
    snapshots  persist a memory snapshot newer than the disk before any choice
    stopping   `stop`: SIGTERM a live supervisor and wait for it
    wakeup     self-pipe + signal queue the loop sleeps on
    warmable   which commands restart warm (python SCRIPT.py, -m MODULE, a console script, torchrun)
"""

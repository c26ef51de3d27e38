"""resilient-run supervisor: a torch-free daemon that keeps a training job alive.

It talks to the job only through the run directory, whose contract (paths, records, event names,
env names, exit codes) is `trainer_shim.rundir`. One module per idea:

the loop        agent        Supervisor: one loop, signal handlers that only queue, handle_<sig>
                wakeup       self-pipe + signal queue the loop sleeps on
                heartbeat    per-rank liveness from file events and a timer, on our own clock
an attempt      procs        spawn in its own group (die-with-parent), tee the log, kill whole trees
                attempts     Attempt (what runs) and AttemptResult (how it ended, assessed once)
                launch       the torchrun argv; torchrun's per-rank ProcessFailure records
                classify     exactly one Kind per ended attempt, with its evidence
                cgroup       --memory-limit cgroups and the kernel's OOM-kill evidence
after it        decide       one Verdict: smart_restarts (divergence, per-kind budgets) + policy (backoff,
                             crash loops); failure_policy (per-kind argv/env changes), divergence
                choice       the newest valid, never-poisoned checkpoint to resume from
                snapshots    persist a memory snapshot newer than the disk before any choice
                prestart     the next attempt's launcher (prestarted torchrun or warm interpreter)
                learned_timeout  --heartbeat-timeout auto
records         journal      the lock, events.jsonl and supervisor.json (retried when the disk is full),
                             history left by earlier supervisors, a leftover trainer
                metrics      the Prometheus textfile; progress: goodput/lost steps/ETA for it
                notify       systemd sd_notify (READY, WATCHDOG, STATUS)
the CLI         cli, cli_insight   typer: parse only; config (flags + YAML, one schema)
                jobspec      what `run`'s job tokens and run dir mean, checked before anything starts
                render       reports to text and rich tables (status, checkpoints, watch, doctor)
                status, stopping, report, doctor, export   the logic the commands call (plain functions)
                messages     `say`: the one-line stderr messages; errors: exceptions with exit codes
"""

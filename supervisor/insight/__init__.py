"""What the run tells the world: records, status, reports, metrics.

    doctor    `doctor`: run a job twice and compare
    drill     `drill`: a real fault in a live run's trainer, then what the supervisor recorded
    export    `export`: verify a checkpoint here, convert it in a child
    journal   events.jsonl, supervisor.json, history of earlier supervisors
    metrics   the Prometheus textfile
    notify    systemd sd_notify (READY, WATCHDOG, STATUS)
    periodic  every turn of the loop: watchdog, journal retries, metrics file, learned timeouts, mirror poll
    progress  goodput, lost steps, ETA
    render    reports to text and rich tables
    report    what the failures of a run cost, from events.jsonl
    status    status report and checkpoint listing (read-only)
    timeline  `report --png`: global step over wall time, recovery phases, checkpoints
"""

"""What an ended attempt means and what to do next.

    choice           the newest valid, never-poisoned checkpoint to resume from
    classify         exactly one failure kind per ended attempt, with its evidence
    decide           one Decision after an attempt ends
    divergence       what a diverged attempt says about its checkpoints
    failure_policy   per-kind argv/env changes (the job file's `policy:`)
    learned_timeout  --heartbeat-timeout auto
    policy           Decision and Action; backoff, give-up rules, crash loops
    smart_restarts   divergence fallback, per-kind budgets, policy actions
"""

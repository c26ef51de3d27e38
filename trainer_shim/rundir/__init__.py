"""The run-directory contract shared by the supervisor and the trainer shim.

Everything the two sides exchange is defined here and nowhere else: paths and file names,
environment variables and exit codes, the records they write (heartbeats, step marks,
supervisor.json, error files, events, manifests, the checkpoint index, the standby message),
atomic writes and the "newest valid checkpoint" logic. This package never imports torch: the
supervisor imports it on machines without torch.

One module per idea:

    errors     ContractError (the base), InvalidCheckpoint, EnvError
    env        RESILIENT_* names, exit codes, RunEnv (the product environment, parsed once)
    layout     RunDir (every path), file-name builders and parsers, ensure_run_dir
    atomic     atomic/durable writes, tolerant JSON reads
    clock      now_iso, iso_at (timestamps in records)
    records    Phase, HeartbeatRecord, RunState, SupervisorState, ErrorRecord, StandbyMessage
    stepmark   StepMark / read_step_mark: the last step a rank really reached
    events     Event (every event name), append/read events, poisoning
    manifest   MANIFEST.json, CheckpointKind, checkpoint validation
    selection  newest valid checkpoint, the `latest` link
    commit     the one commit protocol (tmp dir, hashed members, manifest last, rename), discard
    index      checkpoint_metadata.json, checkpoint search roots
    policies   issue 16: EXIT_DIVERGED, strict-resume env, learned-timeout file
    insight    doctor mode (RESILIENT_DOCTOR*), digest-log records, the first_step event
    frameworks HF Trainer / Lightning layouts: checkpoint-N dirs, extra roots, member names
    snapshots  memory snapshot slots in /dev/shm: names, the owner/mode trust rule, find/persist/free

Run-dir layout::

    RUN_DIR/
      supervisor.json            supervisor state (supervisor writes)
      supervisor.lock            flock held by the live supervisor
      events.jsonl               one JSON object per line (both sides append)
      checkpoint_metadata.json   index of committed checkpoints (shim writes)
      heartbeat_timeouts.json    learned heartbeat intervals per phase (supervisor, --heartbeat-timeout auto)
      metrics.prom               Prometheus textfile (supervisor writes)
      heartbeats/rank-<R>.json   liveness, one per rank (shim writes)
      heartbeats/rank-<R>.step   step mark: last step reached, 8 bytes (shim writes via mmap)
      checkpoints/step-XXXXXXXX/ committed checkpoints, MANIFEST.json written last
      checkpoints/.tmp-*         in-flight or abandoned writes, never chosen
      checkpoints/latest         symlink to the newest committed checkpoint
      checkpoint-N/              a HF Trainer's checkpoints (in its output_dir; MANIFEST.json added)
      checkpoint_roots.json      other dirs holding checkpoint dirs (a Trainer's output_dir)
      logs/attempt-NNNN.log      child output per attempt (supervisor writes)
      logs/stacks-<pid>.txt      faulthandler dumps on SIGUSR1 (shim writes)
      errors/attempt-N.json      uncaught exception of attempt N (shim writes; rank 0)
      errors/attempt-N-rank-R.json  the same for rank R > 0 of a distributed attempt
      nodes/node-<N>/            a multi-node job: each supervisor's own files (state, lock,
                                 events, logs, errors, metrics)
"""

from . import commit
from .atomic import atomic_write_bytes, atomic_write_json, exchange, fsync_dir, read_json
from .clock import iso_at, now_iso
from .env import (
    ENV_ALLOW_RESHARD, ENV_ATTEMPT, ENV_LAST_FAILURE, ENV_NODE, ENV_RESUME_FROM, ENV_RUN_DIR, EXIT_PREEMPTED,
    RESUME_NONE, RunEnv, parse_bool,
)
from .errors import ContractError, EnvError, InvalidCheckpoint
from .events import POISONED, Event, append_event, is_poisoning, next_attempt_number, poisoned_checkpoints, read_events
from .frameworks import (
    HF_PREFIX, LIGHTNING_CKPT, ROOTS_FILE, hf_checkpoint_name, parse_hf_checkpoint_name, read_extra_roots,
    record_extra_root, roots_file,
)
from .index import checkpoint_roots, index_entry, read_index
from .insight import (
    ENV_DOCTOR, ENV_DOCTOR_FAULTS, ENV_DOCTOR_STEPS, EVENT_CHECKPOINT_SAVED, EVENT_FIRST_STEP, FAULT_KILL,
    FAULT_RAISE, MARK_BATCH, MARK_EPOCH, MARK_STEP, parse_faults,
)
from .layout import (
    CHECKPOINTS, CKPT_PREFIX, LATEST, NODES, RUN_DIR_MODE, TMP_PREFIX, RunDir, checkpoint_name,
    ensure_run_dir, heartbeat_name, inside, parse_checkpoint_name, parse_heartbeat_name, step_mark_name, tmp_dirs,
)
from .manifest import (
    FORMAT_VERSION, MANIFEST_NAME, CheckpointInfo, CheckpointKind, FileEntry, Manifest, digest_file,
    commit_age, inspect_checkpoint, new_hasher, safe_member,
)
from .records import (
    HEARTBEAT_FIELDS, ErrorRecord, HeartbeatRecord, Phase, RunState, StandbyMessage, SupervisorState, read_heartbeat,
    read_heartbeat_record,
)
from .selection import iter_checkpoint_dirs, newest_valid, repoint_latest
from .snapshots import (
    SHM_DIR, SNAPSHOT_PREFIX, SNAPSHOT_SLOTS, TABLE_SUFFIX, TENSOR_REF, TENSORS_SUFFIX, snapshot_slot_paths,
    snapshot_slot_ranks,
    untrusted_slot_reason,
    complete_slots, free_slots, newest_complete, persist_newest, persist_slot, remove_slot,
)
from .stepmark import STEP_MARK_SIZE, StepMark, reached_step, read_step_mark
from .policies import (
    DIVERGED_ERROR_TYPE, DIVERGED_REASON, ENV_STRICT_RESUME, EXIT_DIVERGED, KIND_DIVERGED, LEARNED_TIMEOUTS_FILE,
    ON_NONFINITE_CHOICES, RESUME_REFUSED_ERROR_TYPE,
)

__all__ = [
    # issue 16: divergence, provenance refusal, learned timeouts
    "EXIT_DIVERGED", "KIND_DIVERGED", "DIVERGED_REASON", "DIVERGED_ERROR_TYPE", "RESUME_REFUSED_ERROR_TYPE",
    "ENV_STRICT_RESUME", "ON_NONFINITE_CHOICES", "LEARNED_TIMEOUTS_FILE",
    # errors
    "ContractError", "InvalidCheckpoint", "EnvError",
    # environment and exit codes
    "ENV_RUN_DIR", "ENV_ATTEMPT", "ENV_RESUME_FROM", "ENV_LAST_FAILURE", "ENV_ALLOW_RESHARD", "ENV_NODE",
    "RESUME_NONE", "EXIT_PREEMPTED", "RunEnv", "parse_bool",
    # layout
    "RunDir", "ensure_run_dir", "CHECKPOINTS", "NODES", "LATEST", "TMP_PREFIX", "CKPT_PREFIX", "RUN_DIR_MODE",
    "checkpoint_name", "parse_checkpoint_name", "heartbeat_name", "parse_heartbeat_name",
    "step_mark_name", "tmp_dirs", "inside",
    # files
    "fsync_dir", "exchange", "atomic_write_bytes", "atomic_write_json", "read_json", "now_iso", "iso_at",
    # records
    "Phase", "HEARTBEAT_FIELDS", "HeartbeatRecord", "read_heartbeat", "read_heartbeat_record",
    "RunState", "SupervisorState", "ErrorRecord", "StandbyMessage", "StepMark", "read_step_mark", "reached_step",
    "STEP_MARK_SIZE",
    # events
    "Event", "POISONED", "append_event", "read_events", "next_attempt_number", "is_poisoning",
    "poisoned_checkpoints",
    # checkpoints
    "FORMAT_VERSION", "MANIFEST_NAME", "CheckpointKind", "FileEntry", "Manifest", "CheckpointInfo",
    "new_hasher", "digest_file", "safe_member", "inspect_checkpoint", "commit_age", "iter_checkpoint_dirs", "newest_valid",
    "repoint_latest", "index_entry", "read_index", "checkpoint_roots",
    "ENV_DOCTOR", "ENV_DOCTOR_FAULTS", "ENV_DOCTOR_STEPS", "EVENT_FIRST_STEP", "EVENT_CHECKPOINT_SAVED", "MARK_STEP",
    "MARK_BATCH", "MARK_EPOCH", "FAULT_KILL", "FAULT_RAISE", "parse_faults",
    # framework layouts (issue 13)
    "HF_PREFIX", "hf_checkpoint_name", "parse_hf_checkpoint_name", "ROOTS_FILE", "roots_file", "read_extra_roots",
    "record_extra_root", "LIGHTNING_CKPT",
    # memory snapshot slots (issue 14)
    "SHM_DIR", "SNAPSHOT_PREFIX", "SNAPSHOT_SLOTS", "TABLE_SUFFIX", "TENSORS_SUFFIX", "TENSOR_REF",
    "snapshot_slot_paths",
    "snapshot_slot_ranks",
    "untrusted_slot_reason",
    "complete_slots", "newest_complete", "persist_slot", "persist_newest", "free_slots", "remove_slot",
    # the commit protocol (module)
    "commit",
]

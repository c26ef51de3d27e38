"""The run-directory contract shared by the supervisor and the trainer shim.

Everything the two sides exchange is defined here and nowhere else: paths and file names,
environment variables and exit codes, the records they write (heartbeats, step marks,
supervisor.json, error files, events, manifests, the checkpoint index, the standby message),
atomic writes and the "newest valid checkpoint" logic. This package never imports torch: the
supervisor imports it on machines without torch.

One module per idea:

    errors     ShimError (the root of every shim error), ContractError (the contract's base),
               InvalidCheckpoint, EnvError
    env        every RESILIENT_* name; RunEnv (the product environment, parsed once), parse_bool;
               doctor mode's digest-log record kinds and injected faults;
               LauncherEnv (what torchrun sets)
    exits      every exit code: the trainer's (preempted, diverged, refused, crash) and the commands'
    kinds      Kind (how an attempt ended), the error-record types that name a kind
    layout     RunDir (every path), file-name builders and parsers, ensure_run_dir
    atomic     atomic/durable writes, tolerant JSON reads
    clock      now_iso, iso_at (timestamps in records)
    records    Phase, HeartbeatRecord, RunState, SupervisorState, ErrorRecord, StandbyMessage
    stepmark   StepMark / read_step_mark: the last step a rank really reached
    events     Event (every event name), append/read events, poisoning, gave_up reasons
    manifest   MANIFEST.json, CheckpointKind, checkpoint validation
    selection  newest valid checkpoint, the `latest` link
    pending    a checkpoint the supervisor is still downloading (a new node's first attempt waits for it)
    commit     the one commit protocol and its driver (Draft: tmp dir, manifest last, rename, `latest`),
               the one write loop (HashingWriter, write-back while writing), discard
    index      checkpoint_metadata.json (its one writer), checkpoint search roots
    rotation   the pure retention policy: which checkpoints to delete, which are the best
    frameworks HF Trainer / Lightning layouts: checkpoint-N dirs, extra roots, member names;
               auto-attach: the bootstrap dir, the callback options
    warm       warm restarts: the frameworks a trainer imported (for the next attempt's warm
               interpreter), the warm interpreter's ready file
    snapshots  memory snapshot slots in /dev/shm (or RESILIENT_SHM_DIR): names, the owner/mode trust
               rule, find/persist/free
    mount_table  what is mounted where (/proc/self/mounts): cgroup hierarchies, whether a dir is in RAM
    trackers   experiment trackers across attempts: the W&B / MLflow run ids and TensorBoard log dir
               all attempts share (RUN_DIR/trackers/), the trackers' env names, the resume tag
    slot_memory  who holds slot memory (owner records), what it weighs, the stale rule, freeing it
    titles     process titles (supervisor, standby, trainer) naming the run dir, set when setproctitle is there

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
      checkpoints/.downloading.json  the checkpoint the live supervisor is downloading from the mirror
                                 (supervisor writes, removes when done; the trainer waits for it)
      checkpoint-N/              a HF Trainer's checkpoints (in its output_dir; MANIFEST.json added)
      checkpoint_roots.json      other dirs holding checkpoint dirs (a Trainer's output_dir)
      logs/attempt-NNNN.log      child output per attempt (supervisor writes)
      logs/standby-NNNN.ready    the warm interpreter for attempt N has done its imports (it writes)
      trackers/<name>            W&B run id, MLflow run id, TensorBoard log dir shared by the attempts
      imported_frameworks.json   frameworks the last trainer imported, for the next warm interpreter (shim writes)
      logs/stacks-<pid>.txt      faulthandler dumps on SIGUSR1 (shim writes)
      errors/attempt-N.json      uncaught exception of attempt N (shim writes; rank 0)
      errors/attempt-N-rank-R.json  the same for rank R > 0 of a distributed attempt
      nodes/node-<N>/            a multi-node job: each supervisor's own files (state, lock,
                                 events, logs, errors, metrics)
"""

from __future__ import annotations

import importlib
from typing import Any

# Where every exported name lives: the one declaration of this package's surface. Submodules load
# on first use, so the trainer's `init()` pays only for the parts of the contract it touches
# (importing all 22 modules cost a training process ~2,500 lines it never ran).
_EXPORTS: dict[str, str] = {
    "errors": "ContractError EnvError InvalidCheckpoint ShimError",
    "env": (
        "FAULT_KILL FAULT_RAISE MARK_BATCH MARK_EPOCH MARK_STEP parse_faults "
        "ENV_ALLOW_RESHARD ENV_ATTEMPT ENV_DOCTOR ENV_DOCTOR_FAULTS ENV_DOCTOR_STEPS ENV_LAST_FAILURE "
        "ENV_NAMES ENV_NODE ENV_RESUME_FROM ENV_RUN_DIR ENV_SHM_DIR ENV_STRICT_RESUME ENV_CALLBACK ENV_TRACKERS "
        "RESUME_NONE RunEnv LauncherEnv parse_bool"
    ),
    "exits": (
        "EXIT_BAD_INPUT EXIT_CRASH EXIT_DIVERGED EXIT_DOCTOR_FAILED EXIT_EXACT EXIT_GAVE_UP "
        "EXIT_INTERRUPTED EXIT_INVALID_CHECKPOINT EXIT_LOCKED EXIT_NOT_EXACT EXIT_NOT_RECOVERED EXIT_NOT_STOPPED EXIT_OK "
        "EXIT_PREEMPTED EXIT_REFUSED EXIT_STOPPED EXIT_SUPERVISOR_GONE EXIT_UNHEALTHY EXIT_USAGE"
    ),
    "kinds": "DIVERGED_ERROR_TYPE RESUME_REFUSED_ERROR_TYPE Kind",
    "layout": (
        "CHECKPOINTS CKPT_PREFIX LATEST NODES RUN_DIR_MODE TMP_PREFIX RunDir checkpoint_name "
        "ensure_run_dir heartbeat_name inside parse_checkpoint_name parse_heartbeat_name "
        "step_mark_name tmp_dirs discard_abandoned"
    ),
    "atomic": "atomic_write_bytes atomic_write_json exchange fsync_dir read_json",
    "clock": "iso_at now_iso process_start_ticks process_start_time start_marks",
    "records": (
        "HEARTBEAT_FIELDS ErrorRecord HeartbeatRecord Phase RunState StandbyMessage SupervisorState "
        "read_heartbeat read_heartbeat_record"
    ),
    "stepmark": "STEP_MARK_SIZE StepMark reached_step read_step_mark",
    "events": (
        "DIVERGED_REASON POISONED Event append_event is_poisoning next_attempt_number "
        "poisoned_checkpoints read_events"
    ),
    "manifest": (
        "FORMAT_VERSION MANIFEST_NAME MODEL_FILE OPTIMIZER_FILE TRAINER_FILE CheckpointInfo "
        "CheckpointKind FileEntry Manifest digest_file commit_age inspect_checkpoint new_hasher "
        "safe_member verify_members"
    ),
    "selection": "choose iter_checkpoint_dirs newest_valid",
    "commit": "Draft repoint_latest",
    "pending": "DOWNLOAD_RECORD announce_download download_pending settle_download wait_for_download",
    "index": "add_to_index checkpoint_roots index_entry read_index write_index",
    "frameworks": (
        "ATTACH_DIR AUTO_INTERVAL CALLBACK_OPTIONS DEFAULT_MTBF_HOURS HF_PREFIX LIGHTNING_CKPT ROOTS_FILE hf_checkpoint_name "
        "parse_callback_options parse_hf_checkpoint_name read_extra_roots record_extra_root "
        "roots_file"
    ),
    "warm": "PRELOAD_FRAMEWORKS frameworks_of_child read_warm_ready record_frameworks write_warm_ready",
    "snapshots": (
        "SHM_DIR SNAPSHOT_PREFIX SNAPSHOT_SLOTS TABLE_SUFFIX TENSOR_REF TENSORS_SUFFIX check_shm_dir "
        "slot_prefix snapshot_slot_paths snapshot_slot_ranks untrusted_slot_reason complete_slots "
        "free_slots newest_complete persist_newest persist_slot remove_slot"
    ),
    "mount_table": "fs_type mounts",
    "trackers": (
        "ENV_MLFLOW_RUN_ID ENV_WANDB_RESUME ENV_WANDB_RUN_ID MLFLOW_ID TB_LOGDIR TB_VERSION TRACKERS_DIR WANDB_ID "
        "WANDB_RESUME_ALLOW claim default_logdir is_default_logdir recorded resume_tag tracker_environ"
    ),
    "slot_memory": (
        "STALE_AFTER_S SlotGroup free_group free_stale lock_pid owner_path record_owner run_slots "
        "slot_groups stale_reason"
    ),
    "titles": "Title set_title standby_title supervisor_title trainer_title",
}

_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}
# A name never doubles as a submodule's: importing the submodule would rebind it on the package.
assert not set(_WHERE) & set(_EXPORTS), set(_WHERE) & set(_EXPORTS)
SUBMODULES = tuple(sorted(set(_EXPORTS) | {"rotation"}))

__all__ = sorted(_WHERE) + ["commit"]   # the commit protocol is also used as a module


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        if name in SUBMODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE) | set(SUBMODULES))

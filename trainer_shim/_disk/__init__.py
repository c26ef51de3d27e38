"""Checkpoints on disk: the member files, the save and its commit, retention.

Private: users rely only on what `trainer_shim` exports. The commit itself (temporary dir, manifest
last, rename, `latest`) is the contract's, torch-free: trainer_shim.rundir.commit.

    members      member files written hashed and fsynced; commit_members (the manifest of every rank's)
    save         ONE save for 1..N ranks: decide the root, every rank writes its share, rank 0 commits
    retention    index upkeep, rotation (its policy: trainer_shim.rundir.rotation), background deletion
    raw_tensors  the raw tensor layout of a split member (a memory snapshot's format, also on disk)
"""

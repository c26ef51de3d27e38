"""Auto-attach: the directory the supervisor prepends to a job's PYTHONPATH (rundir.ATTACH_DIR).

Python imports `sitecustomize` from the first sys.path entry that has one, at every interpreter
start: ours installs an import hook and then runs the user's own sitecustomize (the next one on
sys.path). Only `sitecustomize` is importable from this directory as a top-level name; this
package file is never imported through PYTHONPATH.

Modules:

    sitecustomize  the import hook (stdlib only): when `transformers.trainer` or a Lightning
                   trainer module has loaded, integrations._autoattach patches its Trainer; when a
                   tracker's module has (SummaryWriter, mlflow), _trackers continues it
"""

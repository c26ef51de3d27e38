"""Looking inside: doctor-mode probes, checkpoint export.

Private: users rely only on what `trainer_shim` exports.

    export  `python -m trainer_shim._insight.export`: a checkpoint to torch/safetensors
    probe   doctor-mode digests, the "state changed after run.step()" warning
"""

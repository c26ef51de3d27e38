"""Launchers the supervisor prestarts: a waiting torchrun, a warm interpreter.

Private: users rely only on what `trainer_shim` exports.

    standby  a prestarted torchrun waiting for "go"
    warm     a warm interpreter for the next attempt of SCRIPT.py
    inline   a launcher's `python FILE.py` child run inside the warm interpreter
    threads  the thread count a warm attempt's script sets (OMP_NUM_THREADS) applied to torch
"""

"""What `mlxcluster run`, `train` and `serve` add around a job (jobs/):

    job_source.py  the job from the launch flags (-i, --hostfile, --local...)
    session.py     one launch session: a command's request, the steps in one
                   order (choose, plan, python, check, send, preflight), a
                   job ready to launch
    program.py     the user's program hand-off (`run`), launched with restarts
    supervisor.py  the half after launch, once for run, train, serve and attach:
                   launch, watch, restart, finish; one JobResult; how any
                   job's end is said, with its exit code (ending)
    preflight.py   the probe, doctor's checks, OpenBLAS, the smoke all_sum
                   (imported only when a preflight runs)
    trainer.py     the trainer hand-off: its arguments parsed once, the job's
                   program, what a restart or a lost host changes
    record.py      the run's record kept here (the launcher's half of the
                   record protocol; the trainer's is reference_train/metrics.py)
    sync.py        data and model folders, and run's script, on every host
                   (through mlxcluster.transfer; code.py: what ranks import)
    fetch.py       a folder a rank wrote on its host (LoRA's adapters), brought here
    attach.py      following a detached run again: a training run's stall watch
                   and its record here made whole (jobs/attach.py follows the lines)

Every step is reported as an event (jobs/events.py); nothing here prints.
"""

"""A reference sharded data-parallel Llama trainer for MLX (see docs/training.md).

Depends on mlx, numpy and pyyaml only (checkpoints use mlx's own safetensors I/O), so it can be copied out of
this project as it is.

Modules, each importing only those listed before it (no circles):

    errors.py             DataError, the trainer's one error type (a message and a hint)
    files.py              file_sha256, and folders renamed into place whole (replace_dir)
    choices.py            the values a setting may take (kernels, dtypes, objectives), named
                          without mlx
    shape.py              ModelArgs, the model's shape (no mlx: config.py checks it)
    fine_tune.py          --fine_tune full, lora or dora: the choices, --lora_keys,
                          adapter_config.json (no mlx)
    disk_room.py          a write that found no room said as a DataError (host, folder, room
                          left, fix); the room looked at before each checkpoint
    corpus.py             the bundled offline corpus, generated from templates
    tokenizer.py          byte, a folder's tokenizer.json, a Hugging Face name: make_tokenizer
    data.py               token files (meta.json, train.bin, val.bin), memory-mapped batches, sharding
    chat.py               JSONL rows in mlx-lm's formats -> token ids and the first trained
                          one, through the model's chat template (jinja2, only when preparing)
    prepare.py            `python -m reference_train.prepare`: a corpus -> token files; the
                          default data directory (the offline corpus, prepared on first use)
    metrics.py            heartbeats, metrics records (file or mlxcluster's record), the loss
                          curve; imports no mlx, so mlxcluster draws the curve without it
    kernels.py            attention, silu and the loss: MLX's, or multiply-adds on Linux's CPU
    compile_cache.py      whether MLX compiles its CPU kernels from nothing (the log says so)
    model.py              ModelArgs, Llama, the loss, sampling
    stages.py             --pipeline: which blocks each stage holds, balanced by bytes (from
                          the safetensors headers, no mlx), the refusals
    hf_io.py              Hugging Face / mlx-lm Llama folders: read (--init_from), written
    precision.py          --dtype / --comm_dtype bfloat16: the compute copy, float32 gradients
    collectives.py        every collective (all_sum, all_gather, send, recv, the gradient
                          average, a pipeline's Exchange) on the stream the precision rule names
    lora.py               --fine_tune lora or dora: LoRALinear, DoRALinear, adapters on a frozen
                          (or quantized) base, OUT/adapters in mlx-lm's format; adapters_off
    objectives.py         --objective sft, dpo or orpo: the loss a step differentiates (DPO and
                          ORPO as mlx-lm-lora computes them), the metrics it reports, the
                          reference model (the adapters off, or a frozen copy)
    config.py             TrainConfig and build_config: defaults, configs/*.yaml, --field flags;
                          imports no mlx, so mlxcluster parses the trainer's arguments without it
    checkpoint.py         atomic checkpoints and their hashes
    storage.py            which hosts see the same --out (a token each): one writer for them (no mlx)
    resume.py             one checkpoint writer per host; the ranks agree on what to resume from;
                          find_storage, the collective that finds who shares --out; a
                          checkpoint checked against the run and loaded (load_folder)
    export.py             `python -m reference_train.export`: a checkpoint as an mlx-lm folder;
                          OUT/adapters written (export_adapters)
    launch_env.py         what the launcher asked for: world size, backend, sum_scatter
    sharded_optimizer.py  --shard_optimizer: each rank's share of the AdamW state
    pipeline_outputs.py   each stage's checkpoint folder and state, their whole steps, the
                          refusal of the other layout's; the outputs' layout (OUT/adapters
                          gathered, OUT/model in shards)
    mfu.py                FLOPs per token and the peak they are measured against
    stopping.py           SIGUSR2: every rank checkpoints at one logged step and stops (the
                          lease of mlxcluster's controller ran out, or `mlxcluster stop`)
    callbacks.py          TrainingCallback: what the loop tells (steps, logged records,
                          evaluations, checkpoints) and who listens: heartbeats, the progress
                          bar, the log lines and the metrics record (no mlx)
    loop.py               train_loop, handed the model, optimizer, data, a step function and a
                          callback; the step function's contract (StepFunction, StepResult);
                          the validation loss (validation)
    pipeline.py           a pipeline stage (Stage) and its step function (PipelineStep, 1F1B or
                          GPipe): micro-batches, send/recv between stages, the tied embedding
                          kept whole, the validation loss through the stages
    stage_load.py         each rank builds its stage only, reading only its tensors
    mirror.py             each stage's checkpoints mirrored on the next stage's host (sent
                          in chunks), unless they share a disk or the pipeline has copies
    resplit.py            a pipeline's checkpoints resumed over another --pipeline: the pieces
                          each disk holds, the layout, step and sources chosen, the re-cut
    data_parallel.py      the data-parallel step function (gradients averaged over every rank)
                          and the run's part (DataParallel: the whole model on every rank)
    pipeline_setup.py     --pipeline N: the pipeline (and copies') groups, this rank's stage,
                          and the run's part (Pipeline: a stage's model, step, checkpoints,
                          resume and export)
    parallelism.py        the part the Trainer holds (Parallelism: data-parallel or a
                          pipeline) and the choice of it
    train.py              the Trainer (the data, the loop, resume, checkpoints, the log) and
                          main: `python -m reference_train.train`; it never asks which
                          parallelism it holds
"""

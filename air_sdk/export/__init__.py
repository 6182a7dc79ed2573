"""Export a job's metrics to the trackers teams already use: MLflow, W&B, TensorBoard.

The gateway does it from the event log (`JobSpec.export`, `air submit --export`), not the
training loop: the ranks pay nothing, and what a crashed rank logged is exported all the
same.

    service.py   ExportService: a gateway thread that follows each exporting job's events
                 and feeds them, in order, to one worker process per (job, tracker); its
                 position is kept in `<gateway home>/exports/<job>/<tracker>/state.json`,
                 so a restarted gateway carries on where it stopped
    worker.py    `python -m air_sdk.export.worker`: the process that imports the
                 tracker's library and writes; its environment holds only that job's
                 credentials for that tracker (MLflow and W&B read them from the env)
    writers.py   one writer per tracker, each over the library's own client: MlflowClient,
                 wandb.init, torch's SummaryWriter

What is exported: rank 0's `air.log` points (the series the notebook chart draws), each
committed checkpoint (step and path), and the final state with its reason.
"""

"""Runs the reproduction's jobs as ordinary `roformer` commands, skipping what is already done.

Each job is a child process (`python -m launcher.cli ...`, an argument list, no shell) whose console
output goes to OUT/logs/<job>.log; this process prints one line per job. Ctrl-C or SIGTERM stops the
running jobs (one SIGTERM each: a pretraining run checkpoints first) and starts no more. A pretraining run that was
interrupted is simply started again: `roformer pretrain` resumes its run directory. A fine-tune
report is written atomically by `roformer finetune --out`, so an existing report is a finished job.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.common.cores import usable_cores
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_text
from launcher.reproduce.reproduction_plan import EvalRun, FinetuneRun, Preset, PretrainRun


@dataclass(frozen=True)
class Layout:
    """Paths under the reproduction's output directory (see launcher/reproduce/reproduction_plan.py)."""

    out: Path

    def data(self, name: str = "data") -> Path:
        return self.out / name

    def run_dir(self, run: PretrainRun | str) -> Path:
        return self.out / "runs" / (run if isinstance(run, str) else run.name)

    def export(self, run: PretrainRun | str) -> Path:
        return self.run_dir(run) / "export"

    def finetune_report(self, run: FinetuneRun) -> Path:
        return self.out / "finetune" / f"{run.name}.json"

    def eval_report(self, run: EvalRun) -> Path:
        return self.out / "eval" / f"{run.name}.json"

    def schedule(self, run: PretrainRun) -> Path:
        return self.out / "schedules" / f"{run.name}.yaml"

    def log(self, job: str) -> Path:
        return self.out / "logs" / f"{job}.log"

    @property
    def report(self) -> Path:
        return self.out / "report"


def trained_steps(run_dir: Path) -> int:
    """Steps of the newest complete checkpoint of a run directory (0 when there is none)."""
    complete = CheckpointCatalogue.scan(run_dir).complete()
    return complete[-1].step if complete else 0


def is_finished(run_dir: Path) -> bool:
    """A complete checkpoint at the end of its schedule."""
    return any(e.step >= e.sidecar.total_steps for e in CheckpointCatalogue.scan(run_dir).complete())


class Runner:
    def __init__(self, preset: Preset, layout: Layout, data_dir: Path | None = None,
                 log=lambda line: print(line, flush=True)):
        self.preset, self.layout, self.log = preset, layout, log
        self.given_data = data_dir
        self.env = dict(os.environ)
        if "OMP_NUM_THREADS" not in self.env and preset.pretrain_jobs > 1:
            # Side-by-side runs share the cores: each rank would otherwise take the machine's cores / its job's ranks
            # (launcher/train/rank_entry.py) and the jobs' threads would spin waiting for each other.
            self.env["OMP_NUM_THREADS"] = str(max(1, usable_cores() // (preset.pretrain_jobs * preset.num_ranks)))
        self._children: set[subprocess.Popen] = set()  # jobs running now (several with parallel workers)
        self._children_lock = threading.Lock()
        self._stopping = False  # set by stop_children: a worker that dequeued a job starts no child

    def data_dir(self, name: str) -> Path:
        """A prepared corpus: --data when given (for OUT/data), else OUT/<name>."""
        return self.given_data if (self.given_data is not None and name == "data") else self.layout.data(name)

    def prepare_data(self, runs: list[PretrainRun]) -> None:
        """Prepare each corpus the runs train on (once: a directory with a manifest is kept)."""
        args = {"data": self.preset.prepare_args, "data-recipe": self.preset.recipe_prepare_args}
        for name in sorted({run.data for run in runs}):
            out = self.data_dir(name)
            if (out / "manifest.json").is_file():
                self.log(f"{name}: {out} (prepared)")
                continue
            self._run(name, ["data", "prepare", *args[name], "--out", str(out)])

    def pretrain_all(self, runs: list[PretrainRun], export: set[str]) -> None:
        """Every run (preset.pretrain_jobs at a time) and the exports named in `export`; a run that starts
        from another's export (init_from) only after every run without one."""
        for wave in ([r for r in runs if r.init_from is None], [r for r in runs if r.init_from is not None]):
            self._parallel(lambda run: self.pretrain(run, with_export=run.name in export), wave,
                           self.preset.pretrain_jobs)

    def pretrain(self, run: PretrainRun, with_export: bool) -> None:
        run_dir = self.layout.run_dir(run)
        if is_finished(run_dir):
            self.log(f"pretrain {run.name}: finished earlier ({trained_steps(run_dir)} steps)")
        else:
            overrides = [*run.overrides, f"data.data_dir={self.data_dir(run.data).resolve()}"]
            if run.schedule is not None:
                overrides.append(f"schedule.file={self._write_schedule(run).resolve()}")
            start = [] if run.init_from is None else ["--init-from", str(self.layout.export(run.init_from).resolve())]
            # No --master_port: each `roformer pretrain` claims its own (launcher/launch/ports.py), so
            # the parallel jobs of a wave never share one.
            self._run(f"pretrain-{run.name}",
                      ["pretrain", "--num_gpus", str(self.preset.num_ranks), "--config", str(run.config),
                       "--run-dir", str(run_dir), *start, *[arg for item in overrides for arg in ("--set", item)]])
        if with_export and not (self.layout.export(run) / "config.json").is_file():
            self._run(f"export-{run.name}", ["export", str(run_dir), "--out", str(self.layout.export(run))])

    def _write_schedule(self, run: PretrainRun) -> Path:
        """OUT/schedules/<run>.yaml from the plan; an existing one must say the same (a resumed run
        must not silently get another schedule)."""
        path = self.layout.schedule(run)
        text = yaml.safe_dump({"description": f"written by roformer reproduce for {run.name}",
                               "stages": [dict(stage) for stage in run.schedule]}, sort_keys=False)
        if path.is_file():
            if path.read_text(encoding="utf-8") != text:
                raise UserError(f"{path}: differs from the schedule this release plans for {run.name}; "
                                f"move the run (and this file) aside to start it again")
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        return path

    def evaluate_all(self, runs: list[EvalRun]) -> None:
        """Checkpoint MLM evaluations (one thread each, preset.finetune_jobs side by side); done = report exists."""
        todo = [run for run in runs if not self.layout.eval_report(run).is_file()]
        self._parallel(self.evaluate, todo, self.preset.finetune_jobs)

    def evaluate(self, run: EvalRun) -> None:
        pretrain = next(r for r in self.preset.pretrain_runs((run.part,)) if r.name == run.pretrain)
        tag = [] if run.tag is None else ["--tag", run.tag]
        self._run(f"eval-{run.name}",
                  [str(self.layout.run_dir(run.pretrain)), "--data", str(self.data_dir(pretrain.data)),
                   "--seq-lens", ",".join(map(str, run.seq_lens)), "--tokens", str(run.tokens), *tag,
                   "--attention", run.attention,
                   "--out", str(self.layout.eval_report(run))], module="launcher.reproduce.checkpoint_mlm")

    def finetune_all(self, runs: list[FinetuneRun]) -> None:
        todo = [run for run in runs if not self.layout.finetune_report(run).is_file()]
        if len(todo) < len(runs):
            self.log(f"finetune: {len(runs) - len(todo)} of {len(runs)} reports exist, skipped")
        self._parallel(self.finetune, todo, self.preset.finetune_jobs)

    def _parallel(self, job, items: list, workers: int) -> None:
        """Run job(item) on `workers` threads. The first failure cancels the jobs not yet started (the
        running ones finish: their work is valid); a stop (Ctrl-C, SIGTERM) also ends the running
        children, so a stopped reproduction stops, and re-running it resumes."""
        ended = threading.Event()  # a job failed or a stop came: queued jobs return without running

        def guarded(item) -> None:
            if ended.is_set():
                return
            try:
                job(item)
            except BaseException:
                ended.set()
                raise

        pool = ThreadPoolExecutor(max_workers=max(1, workers))
        try:
            for future in [pool.submit(guarded, item) for item in items]:
                future.result()  # re-raises the first failure
        except BaseException as err:
            ended.set()  # the queued jobs now return at once
            if not isinstance(err, UserError):  # a stop, not a failed job
                self.stop_children()
            raise
        finally:
            pool.shutdown(wait=True)

    def stop_children(self) -> None:
        """SIGTERM every running job (each `roformer` command stops cleanly on it), then wait for them."""
        with self._children_lock:
            self._stopping = True
            children = list(self._children)
        for child in children:
            child.terminate()
        for child in children:
            child.wait()

    def finetune(self, run: FinetuneRun) -> None:
        budget = [] if not run.budget else ["--max-train-examples", str(run.budget)]  # None: all; 0: zero-shot
        self._run(f"finetune-{run.name}",
                  ["finetune", str(self.layout.export(run.pretrain)), "--task", run.task, "--init", run.init,
                   "--max-length", str(run.max_length), "--seed", str(run.seed), "--threads", "1", *budget,
                   *run.args, "--out", str(self.layout.finetune_report(run))])

    def _run(self, job: str, args: list[str], module: str = "launcher.cli") -> None:
        log_path = self.layout.log(job)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        self.log(f"{job}: running (log: {log_path})")
        with open(log_path, "a", encoding="utf-8") as log_file:
            log_file.write(f"\n$ {'roformer' if module == 'launcher.cli' else 'python -m ' + module} {' '.join(args)}\n")
            log_file.flush()
            code = self._call([sys.executable, "-m", module, *args], log_file)
        seconds = time.perf_counter() - started
        if code != 0:
            tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
            raise UserError(f"{job}: `roformer {args[0]}` exited {code} after {seconds:.0f} s; last lines of "
                            f"{log_path}:\n  " + "\n  ".join(tail))
        self.log(f"{job}: done in {seconds:.0f} s")


    def _call(self, command: list[str], log_file) -> int:
        # Own session: a terminal's Ctrl-C reaches only this process, which then sends each job exactly
        # one SIGTERM (`roformer pretrain` takes a second signal as "stop now, skip the checkpoint").
        with self._children_lock:
            if self._stopping:
                raise UserError("stopped before this job started")
            child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
            self._children.add(child)
        try:
            return child.wait()
        finally:
            with self._children_lock:
                self._children.discard(child)

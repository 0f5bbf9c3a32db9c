"""Labels true to what was run (issue 32, item 7): no empty final eval line when none was asked for,
and a long judge name in a plot's y-label is not cut off."""

from __future__ import annotations

import json
from pathlib import Path

from rloo.cli import main
from rloo.eval.plots import plot_training


def test_eval_every_null_prints_no_empty_final_eval_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    rows = [{"prompt": f"post : job rent {i} tl;dr :"} for i in range(40)]  # no references: no win rate
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text("def f(prompts, completions):\n    return [0.5] * len(prompts)\n")
    monkeypatch.chdir(tmp_path)
    argv = ["train", f"policy={tiny_model_dir}", "reward_fn=r.py:f", "dataset.path=p.jsonl", "eval_every=null"]
    rc = main([*argv, "steps=1", "batch_size=2", "k=2", "max_new_tokens=2", "output_dir=out", "report_to=none"])
    err = capsys.readouterr().err
    assert rc == 0, err
    # the Python reward is the judge on a dataset without a reward model (as in the pipeline): the final
    # line carries its score, and nothing prints "no judge scores"
    assert "no judge scores" not in err and "eval at step 1/1 (5 prompts): score 0.500 (judge: r.py:f)" in err, err


def test_a_long_judge_name_fits_in_the_win_rate_plot(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    cut, real = {}, Figure.savefig

    def check(fig, path, **kw):
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            box = ax.yaxis.label.get_window_extent(renderer)
            # savefig gets the temporary sibling's open file (runtime/runfolder/atomic.py: atomic_savefig)
            name = Path(getattr(path, "name", path)).name.removeprefix(".").removesuffix(".tmp")
            cut[name] = bool(box.y0 < 0 or box.y1 > fig.bbox.y1)
        return real(fig, path, **kw)

    monkeypatch.setattr(Figure, "savefig", check)
    recs = [{"step": s, "reward/score": 0.1 * s, "eval/win_rate": 0.05 * s} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    plot_training(tmp_path / "metrics.jsonl", tmp_path / "plots", judge="reward model (runs/tldr-own/reward/model)")
    assert cut.get("win_rate.png") is False, cut

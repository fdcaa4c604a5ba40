"""`megaeval mtbench`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import MODEL_ANSWERING, RUN, command, finish, output, settings_of

SAMPLES = "Per-model, per-question JSONL: the turns, the answers, each turn's rating and judgment."


@command(MODEL_ANSWERING, RUN, output("reports/mtbench.json", SAMPLES))
def mtbench(
    judge: Annotated[
        str | None,
        typer.Option(help="The judge: a served model (openai:URL, e.g. a GPT-4-class API or vLLM) or a local one."),
    ] = None,
    judge_args: Annotated[str, typer.Option(help="The judge's options, key=value,... (as --model-args).")] = "",
    answers: Annotated[
        list[str] | None,
        typer.Option(help="Judge FastChat model_answer files instead of answering (one model each); repeatable."),
    ] = None,
    judgments: Annotated[
        list[str] | None,
        typer.Option(help="Score FastChat model_judgment files as show_result.py does, no model; repeatable."),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            help="A folder laid out as FastChat's data/mt_bench (question.jsonl, reference_answer/); "
            "default: FastChat's MT-Bench, shipped."
        ),
    ] = None,
    reference: Annotated[
        str, typer.Option(help="Reference answers for math, reasoning and coding: reference_answer/NAME.jsonl.")
    ] = "gpt-4",
    judge_prompts: Annotated[
        str | None, typer.Option(help="A judge_prompts.jsonl in FastChat's format; default: FastChat's.")
    ] = None,
    judge_max_tokens: Annotated[int, typer.Option(help="Tokens the judge may write (FastChat: 2048).")] = 2048,
    judge_temperature: Annotated[float, typer.Option(help="The judge's temperature (FastChat: 0, greedy).")] = 0.0,
    judge_id: Annotated[
        str | None, typer.Option(help="The judge's name in the judgments and their file; default: from --judge.")
    ] = None,
    model_id: Annotated[
        str | None, typer.Option(help="The answers' model_id and file name; default: from --model.")
    ] = None,
    first_n: Annotated[int | None, typer.Option(help="Only the first N questions (FastChat's --first-n).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per answer (FastChat: 1024).")] = 1024,
    seed: Annotated[
        int, typer.Option(help="Seed of sampled answers (writing, roleplay, stem, humanities), per question and turn.")
    ] = 0,
    chat_template: Annotated[
        str | None, typer.Option(help="One of the model's several chat templates, by name; default: its own.")
    ] = None,
    system_instruction: Annotated[str | None, typer.Option(help="A system turn before each question.")] = None,
    bos: Annotated[str, typer.Option(help="BOS before a rendered prompt: auto (the template's), always or never.")] = (
        "auto"
    ),
    batch_size: Annotated[
        str, typer.Option(help="Prompts answered or judged together: auto or N (results do not change).")
    ] = "auto",
    allow_unrated: Annotated[
        bool, typer.Option(help="Judge on when the judge's first 10 replies hold no rating (by default: stop).")
    ] = False,
    output_dir: Annotated[
        str, typer.Option(help="Where model_answer/MODEL.jsonl and model_judgment/JUDGE_single.jsonl go.")
    ] = "reports/mt_bench",
    **shared: Any,
) -> None:
    """MT-Bench (the paper's Table 3) as FastChat's llm_judge answers, judges and scores it, with any judge."""
    from ..commands.mtbench import MtbenchSettings, mtbench_summary, run_mtbench
    from ..models import parse_model_args

    settings = MtbenchSettings(
        judge=judge, judge_args=parse_model_args(judge_args), answers=answers or [], judgments=judgments or [],
        data=data, reference=reference, judge_prompts=judge_prompts, judge_max_tokens=judge_max_tokens,
        judge_temperature=judge_temperature, judge_id=judge_id, model_id=model_id, first_n=first_n,
        max_new_tokens=max_new_tokens, seed=seed, chat_template=chat_template, system_instruction=system_instruction,
        bos=bos, batch_size=batch_size, allow_unrated=allow_unrated, output_dir=output_dir,
        **settings_of(shared),
    )  # fmt: skip
    finish(run_mtbench(settings, progress=shared["progress"]), mtbench_summary, settings.out)

"""The documented shape of every benchmark JSON, and a validator (no dependency).

Common to all: ``bench`` (its name), ``machine`` (``cpu``, ``cores``, ``torch``, ``triton``,
``python``, ``platform``, ``torch_threads``, ``gpu`` when there is one, and since issue 14
``cpu_flags`` (the SIMD/bf16 flags seen) and ``dtype_policy`` (``d3d.cpu.precision.auto_dtype``: dtype,
reason, probe timings)), ``config`` (the command-line arguments), ``results``.

speculative: ``results[set][mode]`` = {tok_s, tokens, seconds, per_prompt_tok_s, speedup_vs_ar}
    (since issue 14 also speedup_vs_fastest_ar: over the fastest of ``ar`` in the policy's dtype,
    ``ar-fp32`` (and until 2026-12-04 ``ar1``, ar on weights packed for 1 row), and identical_to_ar: prompts whose output equals ar's) and for speculative modes also {tau, rounds, accept_hist, hit_rate, fallback_rate,
    draft_seconds, hidden_draft_seconds, verify_seconds, and since issue 15 critical_draft_seconds,
    hypotheses_per_round, and since issue 16 verified_drafts_per_round, leaves_per_round and leaf_hit_rate
    (rounds whose bonus was a verified leaf, ``+leavesL``) and lookup_rate (rounds whose draft was copied,
    ``+lookupN``) and datastore_rate (rounds whose draft came
    from the datastore, ``+storeN``); async modes also hit_rate_by_accept,
    hypothesis_pass_rate}; plus ``missing_sets`` {set: reason},
    ``target``, ``drafter``, ``target_parameters``, ``drafter_parameters``.
decode: ``results`` = [{model, parameters, weight_bytes_per_token, d3d: {tok_s_median, seconds},
    d3d_gb_s, transformers?: {...}, speedup_vs_transformers?}], ``copy_bandwidth_gb_s``.
kernels: ``attention`` and ``sampling``, each a payload of its own (results = list of rows with
    case, method, ms (median, min, max) and TFLOP/s with the share of the measured matmul peak, or
    GB/s with the share of the measured copy bandwidth), plus ``copy_bandwidth_gb_s`` and
    ``matmul_tflops`` (the ceilings, measured on the same machine in the same run).
passes: ``results`` = [{model, dtype, cpu_matmul, T, ms, ms_min, ms_max, vs_T1, streamed_bytes, gb_s}] (one forward
    pass over T new tokens after ``config.context`` cached ones; streamed_bytes: the matrices' bytes as that row's
    configuration holds them; gb_s: those per median second), plus
    ``models`` {name: {dir, parameters, macs_per_row}} and ``read_gb_s`` (the machine's read
    bandwidth; CPU); quantized weights on a CPU with AVX-512 VNNI add ``int8_macs_per_s`` and each row's ``floor_ms``.
agreement: ``results`` = [{set, prompt, mode, identical}], ``summary`` {mode: {prompts, identical,
    agreement}}, ``divergences`` = [{set, prompt, mode, position, ar_token, spec_token, margin,
    margin_fp32}] (margins: {a_minus_b, top2_gap, a_is_argmax}), ``dtype``.
gpu: ``device`` (versions, device name, memory), ``stages`` {name: {status ok|failed|timeout|skipped,
    returncode, seconds, command, and log, tables (its Markdown rows), last_lines when it ran}};
    each stage's own JSON sits beside it in the output directory.
answers: ``results`` = [{mode, seconds, answer_tokens, tok_s, same_answers}] (one row per generation
    mode, same requests), ``target``, ``dtype``.
serve: ``results`` = [{mode, clients, requests, completed, errors, tokens, wall_seconds, tok_s, latency_p50,
    latency_p90, ttft_p50, ttft_p90, vs_1_client, vs_ar}], ``model``, ``rss`` (None, or {requests, samples
    [{requests, rss_mib}], seconds, growth_after_warmup}).
parity: ``results`` = [{prompt, prompt_tokens, max_abs_logit_diff, argmax_agree, greedy_tokens,
    greedy_identical, ...}] for one real checkpoint (``model``, ``parameters``) vs transformers.
"""

from __future__ import annotations

NUM = (int, float)

MACHINE = {"cpu": str, "cores": int, "torch": str, "python": str, "platform": str, "torch_threads": int}
SPEC_ROW = {"tok_s": NUM, "tokens": int, "seconds": NUM, "per_prompt_tok_s": list, "speedup_vs_ar": NUM}
SPEC_EXTRA = {"tau": NUM, "rounds": int, "accept_hist": list, "hit_rate": NUM, "fallback_rate": NUM,
              "draft_seconds": NUM, "hidden_draft_seconds": NUM, "verify_seconds": NUM,
              "critical_draft_seconds": NUM, "hypotheses_per_round": NUM}
DECODE_ROW = {"model": str, "parameters": int, "weight_bytes_per_token": int, "d3d": dict, "d3d_gb_s": NUM}
ATTENTION_ROW = {"case": str, "method": str, "tokens": int, "ms": NUM, "ms_min": NUM, "ms_max": NUM, "tflops": NUM,
                 "of_matmul_peak": NUM}
SAMPLING_ROW = {"case": str, "method": str, "n": int, "ms": NUM, "ms_min": NUM, "ms_max": NUM, "gbs": NUM,
                "of_copy_bandwidth": NUM}


def _check(obj: dict, fields: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    for key, typ in fields.items():
        if key not in obj:
            raise ValueError(f"{where}: missing {key!r}")
        if not isinstance(obj[key], typ) or isinstance(obj[key], bool) and typ is not bool:
            raise ValueError(f"{where}.{key}: expected {typ}, got {type(obj[key]).__name__}")


PASS_ROW = {"model": str, "dtype": str, "T": int, "ms": NUM, "ms_min": NUM, "ms_max": NUM, "vs_T1": NUM,
            "streamed_bytes": int, "gb_s": NUM}
PARITY_ROW = {"prompt": str, "prompt_tokens": int, "max_abs_logit_diff": NUM, "argmax_agree": bool,
              "greedy_tokens": int, "greedy_identical": bool}


def validate(payload: dict) -> None:
    """Raise ValueError naming the first field that does not match the documented schema."""
    _check(payload, {"bench": str, "machine": dict}, "$")
    _check(payload["machine"], MACHINE, "$.machine")
    kind = payload["bench"]
    if kind == "speculative":
        _check(payload, {"config": dict, "results": dict, "missing_sets": dict, "target_parameters": int,
                         "drafter_parameters": int}, "$")
        for name, res in payload["results"].items():
            if "ar" not in res:
                raise ValueError(f"$.results.{name}: missing the 'ar' baseline")
            for mode, row in res.items():
                _check(row, SPEC_ROW, f"$.results.{name}.{mode}")
                if not mode.startswith("ar"):
                    _check(row, SPEC_EXTRA, f"$.results.{name}.{mode}")
    elif kind == "decode":
        _check(payload, {"config": dict, "results": list, "copy_bandwidth_gb_s": NUM}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, DECODE_ROW, f"$.results[{i}]")
    elif kind == "kernels":
        _check(payload, {"attention": dict, "sampling": dict, "copy_bandwidth_gb_s": NUM, "matmul_tflops": NUM}, "$")
        for part, row_schema in (("attention", ATTENTION_ROW), ("sampling", SAMPLING_ROW)):
            _check(payload[part], {"results": list, "config": dict}, f"$.{part}")
            for i, row in enumerate(payload[part]["results"]):
                _check(row, row_schema, f"$.{part}.results[{i}]")
    elif kind == "passes":
        _check(payload, {"config": dict, "results": list, "models": dict}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, PASS_ROW, f"$.results[{i}]")
    elif kind == "agreement":
        _check(payload, {"config": dict, "results": list, "summary": dict, "divergences": list, "dtype": str}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, {"set": str, "prompt": int, "mode": str, "identical": bool}, f"$.results[{i}]")
        for i, row in enumerate(payload["divergences"]):
            _check(row, {"position": int, "margin": dict, "margin_fp32": dict}, f"$.divergences[{i}]")
    elif kind == "gpu":
        _check(payload, {"config": dict, "device": dict, "stages": dict}, "$")
        for name, row in payload["stages"].items():
            _check(row, {"status": str, "seconds": NUM, "command": str}, f"$.stages.{name}")
            if row["status"] not in ("ok", "failed", "timeout", "skipped"):
                raise ValueError(f"$.stages.{name}.status: unknown status {row['status']!r}")
    elif kind == "answers":
        _check(payload, {"config": dict, "results": list, "target": str, "dtype": str}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, {"mode": str, "seconds": NUM, "answer_tokens": int, "tok_s": NUM, "same_answers": int},
                   f"$.results[{i}]")
    elif kind == "serve":
        _check(payload, {"config": dict, "results": list, "model": str}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, {"mode": str, "clients": int, "requests": int, "completed": int, "tok_s": NUM,
                         "latency_p50": NUM, "ttft_p50": NUM}, f"$.results[{i}]")
    elif kind == "parity":
        _check(payload, {"config": dict, "results": list, "model": str, "parameters": int}, "$")
        for i, row in enumerate(payload["results"]):
            _check(row, PARITY_ROW, f"$.results[{i}]")
    elif kind == "target":
        _check(payload, {"config": dict, "model": str, "parameters": int, "bits_per_byte": dict, "completions": dict,
                         "ar_tok_s": NUM}, "$")
        for name, row in payload["bits_per_byte"].items():
            _check(row, {"files": int, "tokens": int, "bits_per_byte": NUM}, f"$.bits_per_byte.{name}")
        _check(payload["completions"], {"n": int, "parse_rate": NUM, "loop_rate": NUM, "sensible_rate": NUM,
                                        "rows": list}, "$.completions")
    elif kind == "quantmm":
        _check(payload, {"config": dict, "results": list, "device": str}, "$")
    elif kind == "quality":
        _check(payload, {"config": dict, "results": dict, "windows": dict, "requests": int}, "$")
    elif kind == "llamacpp":
        _check(payload, {"config": dict, "tok_s": dict, "median_tok_s": dict, "vs_llama_ar": dict,
                         "weight_gb_per_token": NUM, "copy_bandwidth_gb_s": NUM, "d3d_weights": str}, "$")
    else:
        raise ValueError(f"$.bench: unknown benchmark {kind!r}")

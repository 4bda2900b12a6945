"""torchtune's QLoRA (torchao NF4) on tiny models, by hand: ftplan vs one real CPU step.

For each case a tiny Hugging Face model (hidden 256 so that every linear is a multiple of 16384
elements, as torchao's ``to_nf4`` needs) is built in bf16, its decoder linears swapped for
torchtune 0.3.1's QLoRA linears (``ftplan.measure.torchtune_nf4``), and one pure-bf16 step is
counted (``ftplan.measure.lowprec_ref.measure_lowprec_step``): frozen / trainable / gradient /
optimizer bytes and every saved tensor, against ``ftplan.memory.model_states`` and
``saved_activation_bytes(backend="cpu")``; then one ``linear_nf4`` call per shape against
``torchao_nf4.nf4_dequant_peak_bytes``, and compiled with inductor (its fused dequantize).
``tests/test_torchao_nf4_qlora.py`` keeps one case of each in CI.
Run: ``PYTHONPATH=src python benchmarks/torchao_nf4_grid_cpu.py`` (~1 min).
"""

from __future__ import annotations

import sys
import warnings

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BASE = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "tie_word_embeddings": False}
CASES = [  # (model_type, extra config, targets, checkpointing, batch, attn)
    ("llama", {}, ("q_proj", "v_proj"), False, 2, "sdpa"),
    ("llama", {}, ALL, True, 1, "sdpa"),
    ("llama", {}, ALL, False, 2, "eager"),
    ("llama", {}, ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), True, 2, "sdpa"),
    ("mistral", {"sliding_window": 16}, ALL, False, 2, "sdpa"),
    ("qwen3", {"head_dim": 64}, ALL, False, 2, "sdpa"),
]
SHAPES = [(256, 512, 8), (128, 256, 5), (512, 256, 3), (1024, 1024, 4)]


def main() -> int:
    warnings.simplefilter("ignore")
    import ftplan.measure.lowprec_ref as LR
    import ftplan.measure.torchref as TR
    from ftplan.job import Job, LoraSpec, QuantSpec
    from ftplan.measure.torchtune_nf4 import measure_linear_nf4, quantize_like_torchtune
    from ftplan.memory import model_states, saved_activation_bytes
    from ftplan.model import model_from_config
    from ftplan.torchao_nf4 import nf4_dequant_peak_bytes

    bad = 0
    for family, extra, targets, ckpt, batch, attn in CASES:
        cfg = {"model_type": family, **BASE, **extra}
        spec = model_from_config(cfg)
        job = Job(loss="hf", method="qlora", precision="bf16", micro_batch=batch, seq_len=24,
                  gradient_checkpointing=ckpt, attn_impl=attn, quant=QuantSpec(quant_type="torchao-nf4"),
                  lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=targets))
        model = TR.build_model(cfg, dtype="bf16", attn_implementation=attn)
        quantize_like_torchtune(model, set(targets), 8, 16)
        r = LR.measure_lowprec_step(model, batch=batch, seq_len=24, gradient_checkpointing=ckpt, autocast_dtype=None)
        st = model_states(spec, job)
        got = (r.frozen_param_bytes, r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes, r.saved_bytes)
        want = (st.frozen_weights, st.trainable_weights, st.gradients, st.optimizer_states,
                saved_activation_bytes(spec, job, backend="cpu"))
        ok = got == want
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {family:8} {attn:5} ckpt={int(ckpt)} b={batch} {len(targets)} targets: "
              f"measured {got} predicted {want}")
    for out_f, in_f, tokens in SHAPES:
        m = measure_linear_nf4(out_f, in_f, tokens)
        want = nf4_dequant_peak_bytes(out_f * in_f)
        ok = m.saved_weight_only and m.forward_peak_bytes == want == m.backward_peak_bytes
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} linear_nf4 {out_f}x{in_f}, {tokens} tokens: saved {m.saved}, peak "
              f"forward {m.forward_peak_bytes} backward {m.backward_peak_bytes}, predicted {want}")
    bad += _compiled_dequant()
    return 1 if bad else 0


def _compiled_dequant(out_f: int = 512, in_f: int = 1024, tokens: int = 8) -> int:
    """``torch.compile`` (inductor) of torchtune's ``FrozenNF4Linear``: the dequantize is one fused
    kernel, so the forward + backward peak (the profiler's allocation events, inductor's buffers
    included) is the bf16 weight plus the op outputs and gradients, not 14 bytes per element."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ftplan.measure.torchtune_loss import _allocations
    from ftplan.measure.torchtune_nf4 import FrozenNF4Linear
    from ftplan.torchao_nf4 import nf4_dequant_peak_bytes

    n, c = out_f * in_f, 2
    peaks = {}
    for backend in ("eager", "inductor"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = FrozenNF4Linear(torch.randn(out_f, in_f, dtype=torch.bfloat16))
        f = m if backend == "eager" else torch.compile(m, backend=backend)
        x = torch.randn(tokens, in_f, dtype=torch.bfloat16, requires_grad=True)
        f(x).sum().backward()  # compile outside the profile
        x.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            y = f(x)
            y.backward(torch.ones_like(y))
        cur = peak = 0
        for _t, _ptr, nbytes in _allocations(prof):
            cur += nbytes
            peak = max(peak, cur)
        peaks[backend] = peak
    outs = tokens * (2 * out_f + in_f) * c  # the output, its gradient, the input's gradient
    ok = (nf4_dequant_peak_bytes(n) <= peaks["eager"] <= nf4_dequant_peak_bytes(n) + outs
          and c * n <= peaks["inductor"] <= c * n + outs)
    print(f"{'ok ' if ok else 'BAD'} FrozenNF4Linear {out_f}x{in_f}, {tokens} tokens, forward + backward peak: eager "
          f"{peaks['eager']} ({peaks['eager'] / n:.3f} B/element), inductor {peaks['inductor']} "
          f"({peaks['inductor'] / n:.3f} B/element); planned {nf4_dequant_peak_bytes(n)} / {c * n} + op outputs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

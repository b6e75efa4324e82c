"""NumPy float64 reference for RoPE scaling rules (linear, ntk, yarn, llama3).

Written from the equations and from the public definitions in transformers'
modeling_rope_utils.py (_compute_linear_scaling_rope_parameters,
_compute_yarn_parameters, _compute_llama3_parameters) and its config
standardization (RotaryEmbeddingConfigMixin), as an independent check of run.c
and export.py; it shares no code with them.  The interface it checks is the one
of /work/notes/scaling_spec.md (the ROPE header fields, run's flags).

Notation: head size hs, pair i = 0 .. hs/2 - 1 (pair i holds dims (i, i + hs/2)
in Hugging Face's half-split layout), base frequency omega_i = theta^(-2i/hs).
p-RoPE rotates only the first rope_angles = floor(p * hs / 2) pairs; the others
have omega 0 under every rule and are never scaled.  s = factor, L = the
original (trained) context length.

  none    omega_i, attention factor 1
  linear  omega_i / s  (position interpolation)                      af = 1
  ntk     theta' = theta * s^(hs/(hs-2)), omega_i = theta'^(-2i/hs)  af = 1
  yarn    transformers' YaRN, truncate=True.  With d_r = 2*rope_angles and
          b = theta^(d_r/hs) (transformers' partial_rotary_factor view, so that
          b^(-2i/d_r) = theta^(-2i/hs)):
            corr(r)   = d_r * ln(L / (2 pi r)) / (2 ln b)
            low, high = max(floor(corr(beta_fast)), 0), min(ceil(corr(beta_slow)), d_r - 1)
            high     += 0.001 if low == high
            ramp_i    = clamp((i - low) / (high - low), 0, 1)     i = 0 .. d_r/2 - 1
            omega'_i  = ramp_i * omega_i / s + (1 - ramp_i) * omega_i
          (ramp 0: kept, "extrapolated"; ramp 1: divided by s, "interpolated")
          af = attention_factor if given, else get_mscale(s) = 0.1 ln s + 1 (1 if s <= 1)
  llama3  wavelen_i = 2 pi / omega_i; low_wl = L / low_freq_factor, high_wl = L / high_freq_factor
            wavelen > low_wl          -> omega_i / s
            wavelen < high_wl         -> omega_i
            otherwise (both bounds in) -> (1 - smooth) omega_i / s + smooth omega_i,
                                          smooth = (L / wavelen - low) / (high - low)
          af = 1 (an explicit attention factor overrides it for any rule)

The forward pass (tests/reference.py, rope kind "freqs") multiplies cos and sin
of the rotated pairs by af.
"""
import math

import numpy as np

import reference

RULES = ("none", "linear", "ntk", "yarn", "llama3")
RULE_CODE = {name: code for code, name in enumerate(RULES)}  # the header's rope_scaling field
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
LLAMA3_LOW, LLAMA3_HIGH = 1.0, 4.0


def rope_angles(head_size, p):
    """Number of rotated pairs, floor(p * hs / 2), as tests/reference.py counts them."""
    return reference.paper_rope_angles(head_size, p)


def base_omegas(theta, p, head_size):
    """theta^(-2i/hs) for the rotated pairs, 0 for the others; shape (hs/2,)."""
    i = np.arange(head_size // 2, dtype=np.float64)
    omega = theta ** (-2.0 * i / head_size)
    omega[rope_angles(head_size, p):] = 0.0
    return omega


def get_mscale(scale, mscale=1.0):
    """YaRN's attention (magnitude) factor: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _positive(x, default):
    """The header's convention (and transformers' `x or default`): 0 / None means the default."""
    return default if x is None or x == 0 else float(x)


def yarn_correction_range(beta_fast, beta_slow, dim, base, original_len, truncate=True):
    """(low, high) bounds of YaRN's ramp, in transformers' units (clamped to [0, dim - 1]).

    corr(r) is the (fractional) dimension index whose wavelength fits r full
    turns into the original context: 2 pi b^(2 corr/dim) = L / r.
    """
    def corr(rotations):
        return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_ramp(low, high, n):
    """clamp((i - low) / (high - low), 0, 1) for i = 0 .. n-1; high += 0.001 when low == high."""
    if low == high:
        high += 0.001
    return np.clip((np.arange(n, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


def _transformers_rule(base, dim, rule, factor, original_len, beta_fast, beta_slow,
                       attention_factor, low_freq_factor, high_freq_factor, truncate=True):
    """transformers' inv_freq (dim/2 values, rotary dim `dim`, base `base`) and attention factor.

    This is the form transformers computes with partial_rotary_factor: frequencies
    base^(-2i/dim) over the rotated dims only.
    """
    i = np.arange(dim // 2, dtype=np.float64)
    omega = base ** (-2.0 * i / dim) if dim else np.zeros(0)
    s = float(factor)
    if rule == "none":
        af = 1.0
    elif rule == "linear":
        omega, af = omega / s, 1.0
    elif rule == "yarn":
        af = attention_factor if attention_factor else get_mscale(s)
        if dim:
            low, high = yarn_correction_range(_positive(beta_fast, YARN_BETA_FAST),
                                              _positive(beta_slow, YARN_BETA_SLOW),
                                              dim, base, original_len, truncate)
            ramp = yarn_ramp(low, high, dim // 2)
            omega = ramp * (omega / s) + (1.0 - ramp) * omega
        return omega, float(af)
    elif rule == "llama3":
        lo, hi = _positive(low_freq_factor, LLAMA3_LOW), _positive(high_freq_factor, LLAMA3_HIGH)
        L = float(original_len)
        with np.errstate(divide="ignore"):
            wavelen = 2 * math.pi / omega
        out = np.where(wavelen > L / lo, omega / s, omega)
        smooth = (L / wavelen - lo) / (hi - lo)
        medium = ~(wavelen < L / hi) & ~(wavelen > L / lo)
        omega, af = np.where(medium, (1 - smooth) * out / s + smooth * out, out), 1.0
    else:
        raise ValueError(f"rule {rule!r} has no transformers form")
    if attention_factor:
        af = float(attention_factor)
    return omega, af


def check_parameters(rule, factor, original_len, beta_fast=0.0, beta_slow=0.0, attention_factor=0.0,
                     low_freq_factor=0.0, high_freq_factor=0.0):
    """ValueError for values the spec rejects (the tests use it to choose valid inputs)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}")
    for name, v in (("factor", factor), ("beta_fast", beta_fast), ("beta_slow", beta_slow),
                    ("attention_factor", attention_factor), ("low_freq_factor", low_freq_factor),
                    ("high_freq_factor", high_freq_factor)):
        if v is not None and (not math.isfinite(v) or v < 0):
            raise ValueError(f"{name} {v} must be finite and >= 0")
    if not factor > 0:
        raise ValueError("factor must be > 0")
    if rule in ("ntk", "yarn", "llama3") and factor < 1:
        raise ValueError(f"{rule} needs factor >= 1")
    if rule == "none" and factor != 1:
        raise ValueError("rule none with factor != 1 is linear")
    if rule in ("yarn", "llama3") and original_len is None:
        raise ValueError(f"{rule} needs original_len")
    if original_len is not None and original_len < 1:
        raise ValueError("original_len must be >= 1")
    if rule != "yarn" and (beta_fast or beta_slow):
        raise ValueError("beta_fast / beta_slow belong to yarn")
    if rule != "llama3" and (low_freq_factor or high_freq_factor):
        raise ValueError("low/high_freq_factor belong to llama3")
    if rule == "llama3" and not (_positive(high_freq_factor, LLAMA3_HIGH) > _positive(low_freq_factor, LLAMA3_LOW)):
        raise ValueError("llama3 needs high_freq_factor > low_freq_factor")


def scaled_omegas(theta, p, head_size, rule="none", factor=1.0, original_len=None, beta_fast=0.0,
                  beta_slow=0.0, attention_factor=0.0, low_freq_factor=0.0, high_freq_factor=0.0,
                  truncate=True):
    """(omega (hs/2,), attention factor) of a rule, per the spec; zeros for unrotated pairs.

    Zero (or None) for beta_fast, beta_slow, attention_factor, low_freq_factor and
    high_freq_factor means the rule's default, as in the ROPE header.
    """
    check_parameters(rule, factor, original_len, beta_fast, beta_slow, attention_factor,
                     low_freq_factor, high_freq_factor)
    n = head_size // 2
    ra = rope_angles(head_size, p)
    out = np.zeros(n)
    if rule == "ntk":
        d = head_size
        theta_ntk = theta * float(factor) ** (d / (d - 2))
        i = np.arange(ra, dtype=np.float64)
        out[:ra] = theta_ntk ** (-2.0 * i / d)
        return out, float(attention_factor) if attention_factor else 1.0
    d_r = 2 * ra
    base = theta ** (d_r / head_size) if d_r else theta
    omega, af = _transformers_rule(base, d_r, rule, factor, original_len, beta_fast, beta_slow,
                                   attention_factor, low_freq_factor, high_freq_factor, truncate)
    out[:ra] = omega
    return out, af


def wavelengths(omega):
    """2 pi / omega, inf where omega is 0."""
    omega = np.asarray(omega, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(omega > 0, 2 * math.pi / np.where(omega > 0, omega, 1.0), np.inf)


def yarn_bands(theta, p, head_size, factor, original_len, beta_fast=0.0, beta_slow=0.0):
    """For each pair: 'kept' (ramp 0), 'blended' (0 < ramp < 1), 'interpolated' (ramp 1), 'unrotated'."""
    ra = rope_angles(head_size, p)
    d_r = 2 * ra
    bands = ["unrotated"] * (head_size // 2)
    if not ra:
        return bands
    low, high = yarn_correction_range(_positive(beta_fast, YARN_BETA_FAST), _positive(beta_slow, YARN_BETA_SLOW),
                                      d_r, theta ** (d_r / head_size), original_len)
    for i, r in enumerate(yarn_ramp(low, high, ra)):
        bands[i] = "kept" if r == 0 else "interpolated" if r == 1 else "blended"
    return bands


def llama3_bands(theta, p, head_size, original_len, low_freq_factor=0.0, high_freq_factor=0.0):
    """For each pair: 'kept' (wavelen < L/high), 'interpolated' (> L/low), 'blended', 'unrotated'."""
    lo, hi = _positive(low_freq_factor, LLAMA3_LOW), _positive(high_freq_factor, LLAMA3_HIGH)
    wl = wavelengths(base_omegas(theta, p, head_size))
    return ["unrotated" if np.isinf(w) else "kept" if w < original_len / hi
            else "interpolated" if w > original_len / lo else "blended" for w in wl]


# ---------------------------------------------------------------------------
# config.json -> rule parameters, as transformers reads them
# ---------------------------------------------------------------------------

def _as_float(x):
    return None if x is None else float(x)


def scaling_from_config(config):
    """The rotary embedding transformers builds from this config.json dict.

    Gathering (transformers 5's convert_rope_params_to_dict / standardize_rope_params,
    which also reads a 4.x config):
      params = rope_scaling (4.x) or rope_parameters (5.x) or {}
      params.rope_theta            default: top-level rope_theta, else 10000
      params.partial_rotary_factor default: top-level partial_rotary_factor
      rope_type                    params.rope_type, or the pre-4.45 "type", default "default"
      for llama3 and yarn, original_max_position_embeddings: a top-level
        original_max_position_embeddings wins (the Phi-3 exception), else
        params' value, else max_position_embeddings (LlamaConfig default 2048).
    Rules:
      default       factor 1; "proportional": p-RoPE with p = partial_rotary_factor,
                    its optional factor dividing every frequency (= linear)
      linear        factor required
      yarn          factor; only when it is absent (5.x) the ratio
                    max_position_embeddings / original_max_position_embeddings.
                    A present factor is used as is even when that ratio differs
                    (transformers >= 4.56 and 5.x only warn; 4.48-4.55 replaced the
                    factor by the ratio whenever original_max_position_embeddings was
                    set, transformers issue 38224, fixed by PR 40320).
                    attention_factor if given, else get_mscale(factor, mscale) /
                    get_mscale(factor, mscale_all_dim) when both mscale and
                    mscale_all_dim are non-zero, else get_mscale(factor);
                    beta_fast / beta_slow: `or 32` / `or 1`; truncate default True.
      llama3        factor, low_freq_factor, high_freq_factor required.
      anything else (dynamic, longrope, ...) -> ValueError.
    partial_rotary_factor f with a rule other than "proportional" is GPT-NeoX style
    (the first int(f * hs) dims rotate, frequencies base^(-2i/(f hs))): layout "neox";
    run.c holds it as theta = base^(1/f), p = f.

    Returns a dict: rule, theta, p (run.c's view), layout ("paper" or "neox"),
    base, rotary_dim, factor, original_len, beta_fast, beta_slow,
    attention_factor (resolved: the number transformers multiplies cos/sin by),
    low_freq_factor, high_freq_factor, truncate, head_size.
    """
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    params = dict(params)
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    rope_type = params.get("rope_type", params.get("type", "default"))
    base = float(params["rope_theta"])
    prf = _as_float(params.get("partial_rotary_factor"))
    hs = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    max_pos = config.get("max_position_embeddings", 2048)

    out = dict(rule="none", factor=1.0, original_len=None, beta_fast=None, beta_slow=None,
               attention_factor=1.0, low_freq_factor=None, high_freq_factor=None, truncate=True,
               head_size=hs)
    if rope_type == "proportional":
        p = 1.0 if prf is None else prf
        factor = _as_float(params.get("factor")) or 1.0
        out.update(rule="linear" if factor != 1.0 else "none", factor=factor, theta=base, p=p,
                   layout="paper", base=base, rotary_dim=hs)
        return out
    if rope_type not in ("default", "linear", "yarn", "llama3"):
        raise ValueError(f"unsupported rope_type {rope_type!r}")

    if prf is None or prf == 1.0:
        out.update(theta=base, p=1.0, layout="paper", base=base, rotary_dim=hs)
    else:
        r = int(hs * prf)
        if r % 2:
            raise ValueError(f"rotary dim {r} is odd")
        out.update(theta=base ** (1.0 / prf), p=prf, layout="neox", base=base, rotary_dim=r)

    if rope_type in ("yarn", "llama3"):
        if config.get("original_max_position_embeddings") is not None:
            original = config["original_max_position_embeddings"]
        else:
            original = params.get("original_max_position_embeddings") or max_pos
        out["original_len"] = int(original)

    if rope_type == "default":
        return out
    if rope_type == "linear":
        out.update(rule="linear", factor=float(params["factor"]))
        return out
    if rope_type == "llama3":
        out.update(rule="llama3", factor=float(params["factor"]),
                   low_freq_factor=float(params["low_freq_factor"]),
                   high_freq_factor=float(params["high_freq_factor"]))
        return out
    # yarn
    factor = params.get("factor")
    factor = max_pos / out["original_len"] if factor is None else float(factor)
    af = params.get("attention_factor")
    if af is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            af = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            af = get_mscale(factor)
    out.update(rule="yarn", factor=factor, attention_factor=float(af),
               beta_fast=float(params.get("beta_fast") or YARN_BETA_FAST),
               beta_slow=float(params.get("beta_slow") or YARN_BETA_SLOW),
               truncate=bool(params.get("truncate", True)))
    return out


def rope_for_forward(params):
    """The rope dict tests/reference.py's forward pass takes for scaling_from_config's result.

    paper layout: kind "freqs", one omega per half-split pair (zeros for unrotated pairs).
    neox layout:  kind "neox" with the rotary dims' omegas computed as transformers
                  does (rotary dim int(f hs), base = the config's rope_theta).
    Both carry the attention factor.
    """
    kw = {k: params[k] for k in ("factor", "original_len", "beta_fast", "beta_slow", "low_freq_factor",
                                 "high_freq_factor", "truncate")}
    af = params["attention_factor"]
    if params["layout"] == "paper":
        omega, _ = scaled_omegas(params["theta"], params["p"], params["head_size"], params["rule"],
                                 attention_factor=af, **kw)
        return {"kind": "freqs", "omega": omega, "attention_factor": af}
    omega, _ = _transformers_rule(params["base"], params["rotary_dim"], params["rule"],
                                  attention_factor=af, **kw)
    return {"kind": "neox", "base": params["base"], "factor": params["p"], "omega": omega,
            "attention_factor": af}


def rope_dict(theta, p, head_size, rule="none", **kw):
    """The forward-pass rope dict (kind "freqs") for a rule given in run.c's terms."""
    omega, af = scaled_omegas(theta, p, head_size, rule, **kw)
    return {"kind": "freqs", "omega": omega, "attention_factor": af}


def header_fields(rule, factor=1.0, original_len=0, beta_fast=0.0, beta_slow=0.0, attention_factor=0.0,
                  low_freq_factor=0.0, high_freq_factor=0.0):
    """ropefile.header_bytes keyword arguments for a rule (bytes 52..83 of the header)."""
    return dict(rope_scale=factor, rope_scaling=RULE_CODE[rule], rope_original_len=original_len,
                yarn_beta_fast=beta_fast, yarn_beta_slow=beta_slow, rope_attention_factor=attention_factor,
                llama3_low_freq_factor=low_freq_factor, llama3_high_freq_factor=high_freq_factor)

"""Any quantity string is a charge or a 400, never a 500 (DESIGN §7, §9).

Found by a hostile review: a create whose container asks for `1e9999999` cpu was a 500
with a traceback (the decimal arithmetic overflowed). Property tests (Hypothesis) over
quantity strings — exponents far out of range both ways, huge mantissas, NaN and
infinities, signs, unicode digits, every suffix, trailing junk — and over the bodies a
charge is computed from; each either yields a whole number of units within what the
ledger stores, equal to the exact value rounded up as Kubernetes does, or raises
QuantityError (the stage's 400). Then the same strings through the real sidecar and the
real store: 201 or 400 with a Status body, nothing charged for a 400.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.core.quantities import CPU, MAX_UNITS, MEMORY, QuantityError, exact_units, to_units
from sidecar.services.quota.meters import charge_for
from tests.rigs.quota import DEPLOYMENTS, PODS, deployment, pod, quota_env

BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
GRAMMAR = re.compile(
    r"^([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


def expected_units(resource: str, text: str) -> int | None:
    """The exact answer for a well-formed quantity (None: it must be refused)."""
    m = GRAMMAR.match(text.strip())
    if m is None:
        return None
    sign, whole, frac, exponent, suffix = m.groups()
    frac = frac or ""
    if not whole and not frac:
        return None
    digits = int(whole + frac or "0")
    if sign == "-" and digits:
        return None
    power = -len(frac)
    scale = Fraction(1)
    if exponent is not None:
        power += int(exponent)
    elif suffix in BINARY:
        scale = Fraction(1024) ** BINARY[suffix]
    elif suffix:
        power += DECIMAL[suffix]
    if resource == CPU:
        power += 3
    if digits == 0:
        return 0
    # Far beyond the bound either way: decided without computing 10**power.
    magnitude = math.log10(digits) + power + math.log10(scale)
    if magnitude > 30:
        return None
    if magnitude < -30:
        return 1
    value = digits * scale * Fraction(10) ** power
    units = math.ceil(value)
    return units if units <= MAX_UNITS else None


numbers = st.builds(
    lambda sign, whole, dot, frac, tail: f"{sign}{whole}{dot}{frac}{tail}",
    st.sampled_from(["", "+", "-"]),
    st.text("0123456789", max_size=25),
    st.sampled_from(["", "."]),
    st.text("0123456789", max_size=25),
    st.one_of(
        st.sampled_from(["", *BINARY, *(s for s in DECIMAL if s)]),
        st.builds(
            lambda e, sign, n: f"{e}{sign}{n}",
            st.sampled_from(["e", "E"]),
            st.sampled_from(["", "+", "-"]),
            st.integers(0, 10**12),
        ),
    ),
)
junk = st.text(
    # unicode digits and numbers: ARABIC-INDIC ONE and THREE, NKO ZERO, DOUBLE-STRUCK ONE
    st.sampled_from([*"0123456789.+-eEiKMGTPnumk \t", *"\u0661\u0663\u07c0\U0001d7d9\u00bd\u221e"]),
    max_size=40,
)


@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(numbers, junk, st.text(max_size=30)), resource=st.sampled_from([CPU, MEMORY]))
@example(text="1e9999999", resource=CPU)
@example(text="1e-9999999", resource=CPU)
@example(text="9" * 70, resource=MEMORY)
@example(text="0." + "0" * 60 + "1", resource=CPU)
@example(text="NaN", resource=CPU)
@example(text="Infinity", resource=MEMORY)
@example(text="-0", resource=CPU)
@example(text="\u0661\u0662", resource=CPU)
@example(text="1e3m", resource=CPU)
def test_any_quantity_string_is_units_or_a_quantity_error(text: str, resource: str) -> None:
    want = expected_units(resource, text)
    try:
        got = to_units(resource, text)
    except QuantityError as exc:
        message = str(exc)
        refused = True
    else:
        refused = False
    if refused:
        assert want is None or len(text.strip()) > 64, (text, want, message)
        assert len(message) < 200  # the message never echoes a huge string
        return
    assert want is not None, (text, got)
    assert got == want, text
    assert 0 <= got <= MAX_UNITS


@settings(max_examples=500)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.none(),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
    )
)
def test_non_string_quantities_are_units_or_a_quantity_error(value: Any) -> None:
    for units in (to_units, exact_units):
        try:
            got = units(MEMORY, value)
        except QuantityError:
            continue
        assert isinstance(got, int)
        assert 0 <= got <= MAX_UNITS


requests = st.dictionaries(
    st.sampled_from(["cpu", "memory", "gpu"]),
    st.one_of(numbers, junk, st.integers(-5, 10**30), st.floats(), st.none()),
    max_size=3,
)
containers: st.SearchStrategy[list[Any]] = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"name": st.just("c"), "resources": st.fixed_dictionaries({"requests": requests})}
        ),
        st.none(),
        st.integers(),
        st.just({"resources": []}),
    ),
    max_size=3,
)
bodies = st.one_of(
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"containers": containers})}),
    st.fixed_dictionaries(
        {
            "spec": st.fixed_dictionaries(
                {
                    "replicas": st.one_of(
                        st.integers(-3, 10**25), st.floats(), st.text(max_size=3)
                    ),
                    "template": st.fixed_dictionaries(
                        {"spec": st.fixed_dictionaries({"containers": containers})}
                    ),
                }
            )
        }
    ),
    st.none(),
    st.text(max_size=5),
)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_any_body_is_a_charge_or_a_quantity_error(body: Any) -> None:
    try:
        charge = charge_for("deployments", body)
    except QuantityError:
        return
    assert charge["deployments"] == 1
    assert all(isinstance(v, int) and 0 <= v <= MAX_UNITS for v in charge.values()), charge
    json.dumps(charge)


HOSTILE = [
    "1e9999999",
    "1e-9999999",
    "9" * 4000,
    "1" + "0" * 300 + "m",
    "NaN",
    "-Infinity",
    "\u0661\u0660\u0660m",  # 100m in ARABIC-INDIC digits
    "-1",
    "1e3Gi",
    "0x10",
    "1_000",
    " 1 ",
    "9.999999999999999999999999999999e18",
]


async def test_hostile_quantities_through_the_sidecar_are_201_or_400(tmp_path: Path) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        created = 0
        for i, text in enumerate(HOSTILE):
            status, body = await env.send("POST", PODS, pod(f"p{i}", cpu=text))
            assert status in (201, 400, 403), (text, status, body)
            assert isinstance(body, dict), body
            assert body.get("kind") in ("Status", "Pod"), body
            if status == 201:
                created += 1
            else:
                assert "Traceback" not in json.dumps(body)
        # A JSON number too large for any float, and replicas past int32.
        for i, raw in enumerate(
            [
                b'{"metadata":{"name":"n1"},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":1e999}}}]}}',
                json.dumps(deployment("d1", 10**30, "1m")).encode(),
                json.dumps(deployment("d2", 2**40, "1m")).encode(),
            ]
        ):
            path = PODS if i == 0 else DEPLOYMENTS
            status, body = await env.send("POST", path, raw)
            assert status == 400, (raw[:80], status, body)
            assert body["kind"] == "Status", body
        stored = await env.stored(PODS)
        assert len(stored["items"]) == created
        assert (await env.usage("pods"))[1] == 0

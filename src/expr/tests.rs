//! The expression language against minijinja's evaluation of the same
//! expressions (the reference semantics), its refusals, and path templates.

use super::*;

fn check_agrees(source: &str, vars: &[(&str, Json)]) {
    let env = environment();
    let mut slots = HashMap::new();
    let mut values = Vec::new();
    let mut ctx = serde_json::Map::new();
    for (i, (name, value)) in vars.iter().enumerate() {
        slots.insert(name.to_string(), i);
        values.push(Val::from_json(value));
        ctx.insert(name.to_string(), value.clone());
    }
    let mut constants = HashMap::new();
    constants.insert("device.smem_bytes".to_string(), Val::Int(232448));
    ctx.insert("device".into(), serde_json::json!({"smem_bytes": 232448}));
    let fast = compile_fast(
        source,
        &Scope {
            slots: &slots,
            constants: &constants,
        },
    )
    .unwrap_or_else(|| panic!("`{source}` should compile on the fast path"));
    let got = fast.eval(&values).unwrap();
    let want = eval_reference(&env, source, &ctx).unwrap();
    match (&got, &want) {
        (Val::Float(a), Val::Float(b)) => assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{source}: {got:?} vs {want:?}"
        ),
        _ => assert_eq!(got, want, "{source}"),
    }
}

#[test]
fn fast_path_agrees_with_minijinja() {
    let vars = [
        ("M", Json::from(48)),
        ("N", Json::from(128)),
        ("K", Json::from(64)),
        ("s", Json::from(3)),
        ("x", Json::from(2.5)),
    ];
    for source in [
        "(M + N) * K * 2 * s <= device.smem_bytes",
        "M // 16 + N % 7 - K / 3",
        "M * 2 ** 3",
        "16 if M <= 32 else (32 if M <= 96 else 64)",
        "not M > 32 and N >= 128 or K == 0",
        "min(M, N, K) + max(M, 7)",
        "ceil_div(M, 16) * 16",
        "is_pow2(N) and not is_pow2(M)",
        "x * 2 - 0.5",
        "-M + abs(-3)",
        "-M ** 2 + 3",
        "M != 48",
        "(M // 5) * 5 == M - M % 5",
    ] {
        check_agrees(source, &vars);
    }
}

#[test]
fn unsupported_syntax_falls_back() {
    let slots = HashMap::from([("M".to_string(), 0)]);
    let constants = HashMap::new();
    let scope = Scope {
        slots: &slots,
        constants: &constants,
    };
    // Outside the language: filters, chained comparisons, string
    // concatenation, calls of anything but the six functions.
    for source in [
        "M | abs",
        "1 < M < 3",
        "'x' ~ M",
        "range(10)",
        "M is odd",
        "[1, 2]",
        "M in (1, 2)",
        // Arithmetic on a string literal: minijinja would fold it as it parses.
        "'x' * 99999999",
        "M + ('x' * 2)",
        "('x' if M else 'y') * 3",
    ] {
        assert!(compile_fast(source, &scope).is_none(), "{source}");
    }
    // A name the scope lacks is an error when it is read, not before.
    let unknown = compile_fast("unknown + 1", &scope).unwrap();
    assert_eq!(
        unknown.eval(&[Val::Int(1)]).unwrap_err(),
        "`unknown` is not defined"
    );
    let guarded = compile_fast("unknown is defined and unknown == 'fp8'", &scope).unwrap();
    assert_eq!(guarded.eval(&[Val::Int(1)]).unwrap(), Val::Bool(false));
}

#[test]
fn membership_and_defined_agree_with_minijinja() {
    let vars = [
        ("M", Json::from(48)),
        ("dtype", Json::from("fp8")),
        ("act", Json::from("bf16")),
    ];
    for source in [
        "dtype in ['bf16', 'fp16']",
        "dtype not in ['bf16', 'fp16']",
        "act in ['bf16', 'fp16'] and M in [16, 48]",
        "M in []",
        "M + 1 in [49]",
        "not M in [48]",
        "128 if M <= 64 or (dtype is defined and dtype == 'fp8') else 64",
        "dtype is not defined",
    ] {
        check_agrees(source, &vars);
    }
}

#[test]
fn path_templates_render_fields_and_refuse_statements() {
    let ctx: serde_json::Map<String, Json> = serde_json::from_value(serde_json::json!({
        "E": 128, "N": 2880, "x": 2.0, "block_shape": [128, 64],
        "device": {"vllm_name": "NVIDIA_H200"}
    }))
    .unwrap();
    assert_eq!(
        render_path(
            "vllm/E={{E}},N={{ N }},device_name={{device.vllm_name}},block_shape=[{{block_shape[0]}},{{block_shape[1]}}].json",
            &ctx
        )
        .unwrap(),
        "vllm/E=128,N=2880,device_name=NVIDIA_H200,block_shape=[128,64].json"
    );
    assert_eq!(
        render_path("{{ N // 2 }}-{{x}}.csv", &ctx).unwrap(),
        "1440-2.0.csv"
    );
    let mut long = ctx.clone();
    long.insert("tag".into(), Json::from("t".repeat(3000)));
    assert!(render_path("{{tag}}/{{tag}}.md", &long)
        .unwrap_err()
        .contains("more than 4096 bytes"));
    for (template, why) in [
        ("{% for i in range(9) %}x{% endfor %}.md", "statements"),
        ("{# c #}x.md", "statements"),
        ("{{ E ~ E }}.md", "not an expression"),
        ("{{ 'x' * 99999999 }}.md", "not an expression"),
        ("{{ ('x') + ('x') }}.md", "not an expression"),
        ("{{ E | string }}.md", "not an expression"),
        ("{{E.md", "not closed"),
        ("{{ F }}.md", "`F` is not defined"),
    ] {
        let err = render_path(template, &ctx).unwrap_err();
        assert!(err.contains(why), "{template}: {err}");
    }
}

/// Random expressions over hostile integers (the extremes of i64, zero,
/// minus one) through both evaluators: never a panic; where both give an
/// integer or a boolean, the same one. Seeded, a fixed budget of cases.
#[test]
fn random_expressions_never_panic_and_the_evaluators_agree() {
    let env = environment();
    let slots = HashMap::from([("a".to_string(), 0), ("b".to_string(), 1)]);
    let constants = HashMap::new();
    let scope = Scope {
        slots: &slots,
        constants: &constants,
    };
    let atoms = [
        "a",
        "b",
        "0",
        "1",
        "-1",
        "7",
        "9223372036854775807",
        "(-9223372036854775807 - 1)",
    ];
    let ops = ["+", "-", "*", "//", "%", "**"];
    // At the top only: a comparison of a boolean with a number is
    // outside what either evaluator defines the same way.
    let tops = ["<", "==", ">="];
    let calls = ["abs", "ceil_div", "min", "max"];
    let values = [0i64, 1, -1, 3, -7, i64::MAX, i64::MIN];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for _ in 0..3000 {
        let mut expr = atoms[next(atoms.len())].to_string();
        for _ in 0..1 + next(3) {
            let other = atoms[next(atoms.len())];
            expr = match next(3) {
                0 => format!("({expr} {} {other})", ops[next(ops.len())]),
                1 => match calls[next(calls.len())] {
                    "ceil_div" => format!("ceil_div({expr}, {other})"),
                    c @ ("min" | "max") => format!("{c}({expr}, {other})"),
                    c => format!("{c}({expr})"),
                },
                _ => format!("-({expr})"),
            };
        }
        if next(3) == 0 {
            expr = format!(
                "{expr} {} {}",
                tops[next(tops.len())],
                atoms[next(atoms.len())]
            );
        }
        let (a, b) = (values[next(values.len())], values[next(values.len())]);
        let fast = compile_fast(&expr, &scope).map(|f| f.eval(&[Val::Int(a), Val::Int(b)]));
        let mut ctx = serde_json::Map::new();
        ctx.insert("a".into(), Json::from(a));
        ctx.insert("b".into(), Json::from(b));
        let reference = eval_reference(&env, &expr, &ctx);
        if let (Some(Ok(f @ (Val::Int(_) | Val::Bool(_)))), Ok(r)) = (&fast, &reference) {
            assert_eq!(f, r, "{expr} at a={a}, b={b}");
        }
    }
}

#[test]
fn runtime_errors_are_reported_not_panics() {
    let slots = HashMap::from([("M".to_string(), 0)]);
    let constants = HashMap::new();
    let f = compile_fast(
        "10 // M",
        &Scope {
            slots: &slots,
            constants: &constants,
        },
    )
    .unwrap();
    assert_eq!(f.eval(&[Val::Int(0)]).unwrap_err(), "division by zero");
}

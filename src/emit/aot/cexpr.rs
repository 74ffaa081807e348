//! Manifest expressions as C, for the `aot` output's launchers.
//!
//! A launcher computes its grid, block, shared memory and scalar arguments
//! from the shape it is called with, so the expressions a manifest writes
//! for them (`ceil_div(N, BLOCK_N)`, `32 * WARPS_M * WARPS_N`) become C.
//! Everything known when the output is written is folded in: the
//! specialisation's config, the shape fields that are not integers (the
//! dtype: one per dispatcher), `device.*`. The integer shape fields (`M`,
//! `N`, `K`) are the dispatcher's `int64_t` parameters.
//!
//! The language is the subset of manifest expressions the runner's fast
//! evaluator knows (`crate::expr`): literals, names, arithmetic, comparisons,
//! `and`/`or`/`not`, `x if c else y`, `min`, `max`, `abs`, `ceil_div`,
//! `is_pow2`. What reads a shape field must be integer arithmetic (`//` and
//! `%` as Python's floor division and modulo for a positive divisor, as the
//! runner's evaluator computes them; `/` gives a float and is refused);
//! a constant part may use anything the fast evaluator folds. Anything else
//! is an error that names the construct.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::expr::{arith, compare, tokenize, Tok, Val};

/// A translated expression: a value known now, or C code of an `int64_t`
/// (`Int`) or a truth value (`Bool`, an `int` 0 or 1).
#[derive(Debug, Clone, PartialEq)]
pub enum CVal {
    Const(Val),
    Int(String),
    Bool(String),
}

/// What names mean: constants (config, non-integer shape fields, `device.*`
/// spelt `device.x`) and the runtime integers (C variables of that name).
pub struct CEnv<'a> {
    pub constants: &'a HashMap<String, Val>,
    pub runtime: &'a HashSet<String>,
    /// The prefix of the C helper functions (`<prefix>_floordiv`, ...).
    pub helpers: &'a str,
}

/// The helper functions translated expressions call, for `prefix`.
pub fn helpers(prefix: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "/* Integer helpers of translated manifest expressions: Python's floor\n   \
         division and modulo (for a positive divisor; Euclidean otherwise, as\n   \
         tunelab's evaluator), ceil_div, min, max, abs. A zero divisor gives 0. */\n\
         static inline int64_t {p}_floordiv(int64_t a, int64_t b) {{\n    \
         if (b == 0) return 0;\n    \
         int64_t q = a / b, r = a % b;\n    \
         if (r < 0) q += b > 0 ? -1 : 1;\n    \
         return q;\n}}\n\
         static inline int64_t {p}_mod(int64_t a, int64_t b) {{\n    \
         if (b == 0) return 0;\n    \
         int64_t r = a % b;\n    \
         if (r < 0) r += b > 0 ? b : -b;\n    \
         return r;\n}}\n\
         static inline int64_t {p}_ceil_div(int64_t a, int64_t b) {{ return {p}_floordiv(a + b - 1, b); }}\n\
         static inline int64_t {p}_min(int64_t a, int64_t b) {{ return b < a ? b : a; }}\n\
         static inline int64_t {p}_max(int64_t a, int64_t b) {{ return b > a ? b : a; }}\n\
         static inline int64_t {p}_abs(int64_t a) {{ return a < 0 ? -a : a; }}\n",
        p = prefix
    );
    out
}

/// Translates `source`.
pub fn translate(source: &str, env: &CEnv<'_>) -> Result<CVal, String> {
    let tokens = tokenize(source).ok_or_else(|| {
        format!("`{source}` uses syntax the aot output cannot translate to C (a string escape, an unknown operator)")
    })?;
    let mut p = Parser {
        tokens,
        pos: 0,
        env,
    };
    let v = p.expr()?;
    if p.pos != p.tokens.len() {
        return Err(format!(
            "`{source}`: the aot output cannot translate what follows position {} to C",
            p.pos
        ));
    }
    Ok(v)
}

/// A translated value as C code of an `int64_t`: an error for strings,
/// floats and nothing.
pub fn as_int(v: &CVal, what: &str) -> Result<String, String> {
    match v {
        CVal::Int(c) | CVal::Bool(c) => Ok(c.clone()),
        CVal::Const(Val::Int(i)) => Ok(int_literal(*i)),
        CVal::Const(Val::Bool(b)) => Ok(if *b { "1" } else { "0" }.into()),
        CVal::Const(other) => Err(format!("{what} is {other:?}, not an integer")),
    }
}

/// A translated value as C code of a `double`.
pub fn as_float(v: &CVal, what: &str) -> Result<String, String> {
    match v {
        CVal::Const(Val::Float(f)) if f.is_finite() => Ok(float_literal(*f)),
        CVal::Const(Val::Float(f)) => Err(format!("{what} is {f}, not a finite number")),
        other => Ok(format!("(double)({})", as_int(other, what)?)),
    }
}

/// An `int64_t` literal (INT64_MIN has no literal of its own).
pub fn int_literal(i: i64) -> String {
    if i == i64::MIN {
        "INT64_MIN".into()
    } else {
        format!("INT64_C({i})")
    }
}

fn float_literal(f: f64) -> String {
    let text = format!("{f:?}");
    if text.contains(['.', 'e', 'E']) {
        text
    } else {
        format!("{text}.0")
    }
}

struct Parser<'a, 'e> {
    tokens: Vec<Tok>,
    pos: usize,
    env: &'a CEnv<'e>,
}

type R = Result<CVal, String>;

impl Parser<'_, '_> {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.pos += 1;
            return true;
        }
        false
    }

    fn eat_name(&mut self, name: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Name(n)) if n == name) {
            self.pos += 1;
            return true;
        }
        false
    }

    fn h(&self, name: &str) -> String {
        format!("{}_{name}", self.env.helpers)
    }

    // expr := or ['if' or ['else' expr]]
    fn expr(&mut self) -> R {
        let then = self.or()?;
        if !self.eat_name("if") {
            return Ok(then);
        }
        let cond = self.or()?;
        let otherwise = if self.eat_name("else") {
            self.expr()?
        } else {
            CVal::Const(Val::None)
        };
        match cond {
            CVal::Const(c) => Ok(if c.truthy() { then } else { otherwise }),
            CVal::Int(c) | CVal::Bool(c) => {
                let both_bool = matches!(
                    (&then, &otherwise),
                    (
                        CVal::Bool(_) | CVal::Const(Val::Bool(_)),
                        CVal::Bool(_) | CVal::Const(Val::Bool(_))
                    )
                );
                let (t, o) = (
                    as_int(&then, "a branch of `if`")?,
                    as_int(&otherwise, "a branch of `if`")?,
                );
                let code = format!("(({c}) ? ({t}) : ({o}))");
                Ok(if both_bool {
                    CVal::Bool(code)
                } else {
                    CVal::Int(code)
                })
            }
        }
    }

    fn or(&mut self) -> R {
        let mut left = self.and()?;
        while self.eat_name("or") {
            let right = self.and()?;
            left = logic("||", left, right)?;
        }
        Ok(left)
    }

    fn and(&mut self) -> R {
        let mut left = self.not()?;
        while self.eat_name("and") {
            let right = self.not()?;
            left = logic("&&", left, right)?;
        }
        Ok(left)
    }

    fn not(&mut self) -> R {
        if self.eat_name("not") {
            return Ok(match self.not()? {
                CVal::Const(v) => CVal::Const(Val::Bool(!v.truthy())),
                CVal::Int(c) | CVal::Bool(c) => CVal::Bool(format!("(!({c}))")),
            });
        }
        self.compare()
    }

    fn compare(&mut self) -> R {
        let left = self.additive()?;
        for op in ["==", "!=", "<=", ">=", "<", ">"] {
            if self.eat_op(op) {
                let right = self.additive()?;
                if ["==", "!=", "<=", ">=", "<", ">"]
                    .iter()
                    .any(|o| matches!(self.peek(), Some(Tok::Op(p)) if p == o))
                {
                    return Err("chained comparisons are not translated to C".into());
                }
                return match (&left, &right) {
                    (CVal::Const(a), CVal::Const(b)) => Ok(CVal::Const(compare(op, a, b)?)),
                    _ => Ok(CVal::Bool(format!(
                        "({} {op} {})",
                        as_int(&left, "a compared value")?,
                        as_int(&right, "a compared value")?
                    ))),
                };
            }
        }
        if matches!(self.peek(), Some(Tok::Name(n)) if n == "in" || n == "is") {
            return match &left {
                CVal::Const(_) => Err("`in` and `is` are not translated to C".into()),
                _ => Err("`in` and `is` on a shape field are not translated to C".into()),
            };
        }
        Ok(left)
    }

    fn additive(&mut self) -> R {
        let mut left = self.multiplicative()?;
        loop {
            let op = if self.eat_op("+") {
                "+"
            } else if self.eat_op("-") {
                "-"
            } else if self.eat_op("~") {
                return Err("`~` (string concatenation) is not translated to C".into());
            } else {
                return Ok(left);
            };
            let right = self.multiplicative()?;
            left = self.binary(op, left, right)?;
        }
    }

    fn multiplicative(&mut self) -> R {
        let mut left = self.unary()?;
        loop {
            let op = ["//", "*", "/", "%"].into_iter().find(|op| self.eat_op(op));
            let Some(op) = op else { return Ok(left) };
            let right = self.unary()?;
            left = self.binary(op, left, right)?;
        }
    }

    fn unary(&mut self) -> R {
        if self.eat_op("-") {
            let inner = self.unary()?;
            return self.binary("-", CVal::Const(Val::Int(0)), inner);
        }
        if self.eat_op("+") {
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> R {
        let base = self.primary()?;
        if self.eat_op("**") {
            let exp = self.unary()?;
            return self.binary("**", base, exp);
        }
        Ok(base)
    }

    fn binary(&self, op: &'static str, a: CVal, b: CVal) -> R {
        if let (CVal::Const(x), CVal::Const(y)) = (&a, &b) {
            return Ok(CVal::Const(arith(op, x, y)?));
        }
        let x = as_int(&a, &format!("an operand of `{op}`"))?;
        let y = as_int(&b, &format!("an operand of `{op}`"))?;
        Ok(CVal::Int(match op {
            "+" | "-" | "*" => format!("({x} {op} {y})"),
            "//" => format!("{}({x}, {y})", self.h("floordiv")),
            "%" => format!("{}({x}, {y})", self.h("mod")),
            "/" => {
                return Err(
                    "`/` of a shape field gives a float: use `//` (floor division) or ceil_div"
                        .into(),
                )
            }
            _ => return Err(format!("`{op}` of a shape field is not translated to C")),
        }))
    }

    fn primary(&mut self) -> R {
        let tok = self.peek().cloned().ok_or("the expression ends early")?;
        self.pos += 1;
        let v = match tok {
            Tok::Int(i) => CVal::Const(Val::Int(i)),
            Tok::Float(f) => CVal::Const(Val::Float(f)),
            Tok::Str(s) => CVal::Const(Val::Str(s.as_str().into())),
            Tok::Op("(") => {
                let inner = self.expr()?;
                if !self.eat_op(")") {
                    return Err("a `(` is not closed".into());
                }
                inner
            }
            Tok::Name(name) => match name.as_str() {
                "true" | "True" => CVal::Const(Val::Bool(true)),
                "false" | "False" => CVal::Const(Val::Bool(false)),
                "none" | "None" => CVal::Const(Val::None),
                _ if self.eat_op("(") => self.call(&name)?,
                _ if self.eat_op(".") => {
                    let Some(Tok::Name(attr)) = self.peek().cloned() else {
                        return Err(format!("`{name}.` is not followed by a name"));
                    };
                    self.pos += 1;
                    let key = format!("{name}.{attr}");
                    CVal::Const(
                        self.env
                            .constants
                            .get(&key)
                            .cloned()
                            .ok_or_else(|| format!("`{key}` is not known"))?,
                    )
                }
                _ => {
                    if self.env.runtime.contains(&name) {
                        CVal::Int(name.clone())
                    } else {
                        CVal::Const(
                            self.env
                                .constants
                                .get(&name)
                                .cloned()
                                .ok_or_else(|| format!("`{name}` is not known"))?,
                        )
                    }
                }
            },
            Tok::Op(op) => return Err(format!("`{op}` is not translated to C")),
        };
        if matches!(self.peek(), Some(Tok::Op("[" | "."))) {
            return Err("indexing and attributes are not translated to C".into());
        }
        Ok(v)
    }

    fn call(&mut self, name: &str) -> R {
        let mut args = Vec::new();
        if !self.eat_op(")") {
            loop {
                args.push(self.expr()?);
                if self.eat_op(")") {
                    break;
                }
                if !self.eat_op(",") {
                    return Err(format!("the arguments of `{name}(` are not closed"));
                }
            }
        }
        let all_const = args.iter().all(|a| matches!(a, CVal::Const(_)));
        let consts: Vec<&Val> = args
            .iter()
            .filter_map(|a| match a {
                CVal::Const(v) => Some(v),
                _ => None,
            })
            .collect();
        match (name, args.len()) {
            ("min" | "max", n) if n >= 1 => {
                if all_const {
                    let better = if name == "min" {
                        |a: f64, b: f64| b < a
                    } else {
                        |a: f64, b: f64| b > a
                    };
                    let mut best = consts[0].clone();
                    for v in &consts[1..] {
                        let (Some(x), Some(y)) = (num(&best), num(v)) else {
                            return Err(format!("{name} of a non-number"));
                        };
                        if better(x, y) {
                            best = (*v).clone();
                        }
                    }
                    return Ok(CVal::Const(best));
                }
                let mut code = as_int(&args[0], &format!("an argument of {name}"))?;
                for a in &args[1..] {
                    code = format!(
                        "{}({code}, {})",
                        self.h(name),
                        as_int(a, &format!("an argument of {name}"))?
                    );
                }
                Ok(CVal::Int(code))
            }
            ("abs", 1) => match &args[0] {
                CVal::Const(Val::Int(i)) => Ok(CVal::Const(Val::Int(i.abs()))),
                CVal::Const(v) => Ok(CVal::Const(Val::Float(
                    num(v).ok_or("abs of a non-number")?.abs(),
                ))),
                other => Ok(CVal::Int(format!(
                    "{}({})",
                    self.h("abs"),
                    as_int(other, "the argument of abs")?
                ))),
            },
            ("ceil_div", 2) => match (&args[0], &args[1]) {
                (CVal::Const(Val::Int(_)), CVal::Const(Val::Int(0))) => {
                    Err("ceil_div by zero".into())
                }
                (CVal::Const(Val::Int(a)), CVal::Const(Val::Int(b))) => {
                    Ok(CVal::Const(Val::Int((a + b - 1).div_euclid(*b))))
                }
                (CVal::Const(_), CVal::Const(_)) => Err("ceil_div takes integers".into()),
                (a, b) => Ok(CVal::Int(format!(
                    "{}({}, {})",
                    self.h("ceil_div"),
                    as_int(a, "an argument of ceil_div")?,
                    as_int(b, "an argument of ceil_div")?
                ))),
            },
            ("is_pow2", 1) => match &args[0] {
                CVal::Const(Val::Int(x)) => {
                    Ok(CVal::Const(Val::Bool(*x > 0 && (x & (x - 1)) == 0)))
                }
                CVal::Const(_) => Err("is_pow2 takes an integer".into()),
                other => {
                    let x = as_int(other, "the argument of is_pow2")?;
                    Ok(CVal::Bool(format!(
                        "(({x}) > 0 && ((({x}) & (({x}) - 1)) == 0))"
                    )))
                }
            },
            ("log2", 1) if all_const => Ok(CVal::Const(Val::Float(
                num(consts[0]).ok_or("log2 of a non-number")?.log2(),
            ))),
            ("log2", 1) => {
                Err("log2 of a shape field gives a float: it is not translated to C".into())
            }
            _ => Err(format!(
                "`{name}` with {} arguments is not translated to C",
                args.len()
            )),
        }
    }
}

fn num(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Float(f) => Some(*f),
        Val::Bool(b) => Some(*b as i64 as f64),
        _ => None,
    }
}

/// `and` / `or`: folded when the left side decides (Python's rule), else C's
/// `&&` / `||` over truth values: both sides must then be truth values (a
/// comparison, `not`, `is_pow2`), since Python's `x or y` is `x` itself.
fn logic(op: &str, left: CVal, right: CVal) -> R {
    if let CVal::Const(l) = &left {
        let decided = if op == "&&" { !l.truthy() } else { l.truthy() };
        return Ok(if decided { left } else { right });
    }
    let truth = |v: &CVal| -> Result<String, String> {
        match v {
            CVal::Bool(c) => Ok(c.clone()),
            CVal::Const(Val::Bool(b)) => Ok(if *b { "1" } else { "0" }.into()),
            _ => Err(format!(
                "`{}` of a value that is not a truth value is not translated to C: compare it (`M > 0`)",
                if op == "&&" { "and" } else { "or" }
            )),
        }
    };
    Ok(CVal::Bool(format!(
        "({} {op} {})",
        truth(&left)?,
        truth(&right)?
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with<'a>(consts: &'a HashMap<String, Val>, runtime: &'a HashSet<String>) -> CEnv<'a> {
        CEnv {
            constants: consts,
            runtime,
            helpers: "t",
        }
    }

    fn setup() -> (HashMap<String, Val>, HashSet<String>) {
        let consts = HashMap::from([
            ("BLOCK_N".to_string(), Val::Int(128)),
            ("WARPS".to_string(), Val::Int(4)),
            ("dtype".to_string(), Val::Str("bf16".into())),
            ("device.sm_count".to_string(), Val::Int(132)),
        ]);
        let runtime = HashSet::from(["M".to_string(), "N".to_string()]);
        (consts, runtime)
    }

    #[test]
    fn constants_fold_and_shape_fields_stay() {
        let (c, r) = setup();
        let env = env_with(&c, &r);
        assert_eq!(
            translate("32 * WARPS", &env).unwrap(),
            CVal::Const(Val::Int(128))
        );
        assert_eq!(
            translate("1 if dtype == 'fp16' else 0", &env).unwrap(),
            CVal::Const(Val::Int(0))
        );
        assert_eq!(
            translate("ceil_div(N, BLOCK_N)", &env).unwrap(),
            CVal::Int("t_ceil_div(N, INT64_C(128))".into())
        );
        assert_eq!(
            translate("min(M // 2, device.sm_count) * 2", &env).unwrap(),
            CVal::Int("(t_min(t_floordiv(M, INT64_C(2)), INT64_C(132)) * INT64_C(2))".into())
        );
        assert_eq!(
            translate("M % 16 == 0 and not N > 4", &env).unwrap(),
            CVal::Bool("((t_mod(M, INT64_C(16)) == INT64_C(0)) && (!((N > INT64_C(4)))))".into())
        );
        assert_eq!(
            translate("64 if M <= 32 else BLOCK_N", &env).unwrap(),
            CVal::Int("(((M <= INT64_C(32))) ? (INT64_C(64)) : (INT64_C(128)))".into())
        );
    }

    #[test]
    fn what_c_cannot_mean_is_refused_with_a_reason() {
        let (c, r) = setup();
        let env = env_with(&c, &r);
        for (source, why) in [
            ("M / 2", "use `//`"),
            ("M or N", "truth value"),
            ("M ** 2", "not translated"),
            ("log2(M)", "float"),
            ("M in [1, 2]", "`in`"),
            ("UNKNOWN + 1", "not known"),
            ("dtype + M", "not an integer"),
        ] {
            let e = translate(source, &env).unwrap_err();
            assert!(e.contains(why), "{source}: {e}");
        }
    }
}

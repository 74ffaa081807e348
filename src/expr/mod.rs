//! Expressions in manifests: constraints, derived values, baselines, native
//! launch expressions and the fields of output path templates.
//!
//! tunelab evaluates them with its own small language, compiled into a
//! closure tree over numbered slots: literals, names, `device.*`, `name[i]`
//! (path templates), arithmetic, comparisons, `in [..]`, `is defined`,
//! `and`/`or`/`not`, `x if c else y`, `min`/`max`/`abs`/`ceil_div`/`log2`/
//! `is_pow2`. An evaluation costs time linear in the expression and builds no
//! value longer than its inputs, so a manifest of a few hundred bytes cannot
//! make it run away (issue 46: Jinja's filters, `range`, loops and string
//! repetition could). The syntax is Jinja's subset: minijinja parses every
//! expression at validation, for its syntax errors and the names it reads,
//! and the tests hold this evaluator to minijinja's on the subset; minijinja
//! never evaluates a manifest's expression or renders its path.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value as Json;

/// A value in the fast evaluator.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
}

impl Val {
    pub fn from_json(v: &Json) -> Val {
        match v {
            Json::Null => Val::None,
            Json::Bool(b) => Val::Bool(*b),
            Json::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => Val::Str(Arc::from(s.as_str())),
            other => Val::Str(Arc::from(other.to_string().as_str())),
        }
    }

    pub fn to_json(&self) -> Json {
        match self {
            Val::None => Json::Null,
            Val::Bool(b) => Json::Bool(*b),
            Val::Int(i) => Json::from(*i),
            Val::Float(f) => serde_json::Number::from_f64(*f)
                .map(Json::Number)
                .unwrap_or(Json::Null),
            Val::Str(s) => Json::String(s.to_string()),
        }
    }

    pub fn truthy(&self) -> bool {
        match self {
            Val::None => false,
            Val::Bool(b) => *b,
            Val::Int(i) => *i != 0,
            Val::Float(f) => *f != 0.0,
            Val::Str(s) => !s.is_empty(),
        }
    }

    fn num(&self) -> Option<f64> {
        match self {
            Val::Int(i) => Some(*i as f64),
            Val::Float(f) => Some(*f),
            Val::Bool(b) => Some(*b as i64 as f64),
            _ => None,
        }
    }
}

/// Instructions one minijinja parse-time evaluation may run (minijinja's
/// fuel): a safety net; tunelab's own evaluator runs every manifest
/// expression.
pub const FUEL: u64 = 100_000;

/// Bytes a rendered template (an output path) may have.
pub const MAX_RENDERED_BYTES: usize = 4096;

/// Bytes an expression or a path template may have: several times the
/// longest a manifest writes (about a hundred), and few enough that the
/// parsers, minijinja's and the fast path's, which recurse once per sign,
/// `not`, `**` or bracket, cannot run out of a thread's stack (5,000 `not`s
/// overflowed the main thread's 8 MiB; a thread of its own has 2 MiB).
pub const MAX_SOURCE_BYTES: usize = 500;

/// Refuses an expression or path template longer than [`MAX_SOURCE_BYTES`],
/// before any parser sees it. `what`: "an expression", "a path template".
pub fn check_length(source: &str, what: &str) -> Result<(), String> {
    if source.len() <= MAX_SOURCE_BYTES {
        return Ok(());
    }
    Err(format!(
        "this is {} bytes long, more than the {MAX_SOURCE_BYTES} {what} may have",
        source.len()
    ))
}

/// The minijinja environment every manifest expression is compiled in. It has
/// no loader, so templates cannot read files; undefined names are errors;
/// every render and evaluation runs on [`FUEL`].
pub fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    env.add_function("min", |args: minijinja::value::Rest<minijinja::Value>| -> Result<minijinja::Value, minijinja::Error> {
        fold_numbers(&args, |a, b| if b < a { b } else { a })
    });
    env.add_function("max", |args: minijinja::value::Rest<minijinja::Value>| -> Result<minijinja::Value, minijinja::Error> {
        fold_numbers(&args, |a, b| if b > a { b } else { a })
    });
    env.add_function(
        "abs",
        |x: minijinja::Value| -> Result<minijinja::Value, minijinja::Error> {
            match i64::try_from(x.clone()) {
                Ok(i) if x.is_integer() => {
                    i.checked_abs().map(minijinja::Value::from).ok_or_else(|| {
                        minijinja::Error::new(
                            minijinja::ErrorKind::InvalidOperation,
                            format!("integer overflow in abs({i})"),
                        )
                    })
                }
                _ => Ok(minijinja::Value::from(f64::try_from(x)?.abs())),
            }
        },
    );
    env.add_function(
        "ceil_div",
        |a: i64, b: i64| -> Result<i64, minijinja::Error> {
            if b == 0 {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    "ceil_div by zero",
                ));
            }
            ceil_div(a, b)
                .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e))
        },
    );
    env.add_function("log2", |x: f64| x.log2());
    env.add_function("is_pow2", |x: i64| x > 0 && (x & (x - 1)) == 0);
    env
}

/// `ceil_div(a, b)` = (a + b - 1) // b (the ceiling of a / b for b > 0);
/// overflow is an error, never a wrap or a panic.
fn ceil_div(a: i64, b: i64) -> Result<i64, String> {
    if b == 0 {
        return Err("ceil_div by zero".to_string());
    }
    a.checked_add(b)
        .and_then(|n| n.checked_sub(1))
        .and_then(|n| n.checked_div_euclid(b))
        .ok_or_else(|| format!("integer overflow in ceil_div({a}, {b})"))
}

/// What tunelab's expressions are, for the error that refuses anything else.
pub const LANGUAGE: &str = "numbers, 'strings', names, device.*, + - * / // % **, comparisons, \
`in [a, b]`, `is defined`, and/or/not, `x if c else y`, min/max/abs/ceil_div/log2/is_pow2";

/// Why an expression is refused: it uses something outside [`LANGUAGE`].
pub fn outside_language(source: &str) -> String {
    let shown: String = source.chars().take(120).collect();
    format!("`{shown}` is not an expression of tunelab's language ({LANGUAGE}; arithmetic on numbers only)")
}

/// A context (names to JSON values) laid out for the compiled evaluator:
/// top-level values as slots; `obj.key` and `list[i]` of scalars as constants.
struct Flat {
    slots: HashMap<String, usize>,
    values: Vec<Val>,
    constants: HashMap<String, Val>,
}

fn flatten(ctx: &serde_json::Map<String, Json>) -> Flat {
    let mut flat = Flat {
        slots: HashMap::new(),
        values: Vec::new(),
        constants: HashMap::new(),
    };
    for (name, value) in ctx {
        match value {
            Json::Object(fields) => {
                for (key, v) in fields {
                    if !v.is_object() && !v.is_array() {
                        flat.constants
                            .insert(format!("{name}.{key}"), Val::from_json(v));
                    }
                }
            }
            Json::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    if !v.is_object() && !v.is_array() {
                        flat.constants
                            .insert(format!("{name}[{i}]"), Val::from_json(v));
                    }
                }
            }
            scalar => {
                flat.slots.insert(name.clone(), flat.values.len());
                flat.values.push(Val::from_json(scalar));
            }
        }
    }
    flat
}

/// Evaluates an expression on `ctx` (a shape's fields, a config's keys,
/// `device` as an object of its facts).
pub fn evaluate(source: &str, ctx: &serde_json::Map<String, Json>) -> Result<Val, String> {
    check_length(source, "an expression")?;
    let flat = flatten(ctx);
    let scope = Scope {
        slots: &flat.slots,
        constants: &flat.constants,
    };
    let compiled = compile_fast(source, &scope).ok_or_else(|| outside_language(source))?;
    compiled.eval(&flat.values)
}

fn fold_numbers(
    args: &[minijinja::Value],
    pick: fn(f64, f64) -> f64,
) -> Result<minijinja::Value, minijinja::Error> {
    let mut best: Option<(f64, minijinja::Value)> = None;
    for a in args {
        let x = f64::try_from(a.clone())?;
        best = Some(match best {
            None => (x, a.clone()),
            Some((b, bv)) => {
                if pick(b, x) == x && x != b {
                    (x, a.clone())
                } else {
                    (b, bv)
                }
            }
        });
    }
    best.map(|(_, v)| v).ok_or_else(|| {
        minijinja::Error::new(
            minijinja::ErrorKind::MissingArgument,
            "min/max need at least one value",
        )
    })
}

/// Variables an expression reads, as minijinja sees them (`device.x` kept whole).
pub fn variables(
    env: &Environment<'static>,
    source: &str,
) -> Result<HashSet<String>, minijinja::Error> {
    let expr = env.compile_expression(source)?;
    Ok(expr.undeclared_variables(true))
}

/// Evaluates with minijinja: the reference semantics the tests hold the
/// compiled evaluator to (never used on a manifest's expression).
#[cfg(test)]
fn eval_reference(
    env: &Environment<'static>,
    source: &str,
    ctx: &serde_json::Map<String, Json>,
) -> Result<Val, String> {
    check_length(source, "an expression")?;
    let expr = env.compile_expression(source).map_err(|e| e.to_string())?;
    let value = expr.eval(ctx).map_err(|e| e.to_string())?;
    let json = serde_json::to_value(&value).map_err(|e| e.to_string())?;
    Ok(Val::from_json(&json))
}

// ---------------------------------------------------------------------------
// The fast path.

type Eval = Box<dyn Fn(&[Val]) -> Result<Val, String> + Send + Sync>;

/// An expression compiled against a slot layout.
pub struct Compiled {
    eval: Eval,
}

impl Compiled {
    pub fn eval(&self, slots: &[Val]) -> Result<Val, String> {
        (self.eval)(slots)
    }
}

/// Names the compiled code may read: slot variables and constants (`device.*`).
pub struct Scope<'a> {
    pub slots: &'a HashMap<String, usize>,
    pub constants: &'a HashMap<String, Val>,
}

/// Compiles `source`, or `None` when it uses something outside the language
/// ([`LANGUAGE`]). A name the scope does not hold compiles to an error at
/// evaluation (as minijinja's strict undefined does), so that `x is defined
/// and x == 1` reads an absent `x` safely; validation names unknown names
/// before anything is evaluated.
pub fn compile_fast(source: &str, scope: &Scope<'_>) -> Option<Compiled> {
    check_length(source, "an expression").ok()?;
    parse(source, scope).ok()
}

/// Compiles `source`, or the byte offset where reading it stopped.
fn parse(source: &str, scope: &Scope<'_>) -> Result<Compiled, usize> {
    let (tokens, offsets) = tokenize_at(source)?;
    let mut p = Parser {
        tokens,
        pos: 0,
        scope,
        string_literal: false,
        seen: std::cell::Cell::new(0),
    };
    let at = |token: usize| offsets.get(token).copied().unwrap_or(source.len());
    let eval = p.expr().ok_or_else(|| at(p.seen.get()))?;
    if p.pos != p.tokens.len() {
        return Err(at(p.pos));
    }
    Ok(Compiled { eval })
}

/// Why `source` is refused, for validation's message: where reading it
/// stopped, and what the language is ([`LANGUAGE`]).
pub fn explain_refusal(source: &str, scope: &Scope<'_>) -> String {
    let at = match parse(source, scope) {
        Ok(_) => return format!("`{source}` is an expression tunelab reads"),
        Err(at) => at,
    };
    let rest: String = source[at..].chars().take(40).collect();
    let place = if rest.trim().is_empty() {
        "it ends too soon".to_string()
    } else {
        format!("it cannot be read from `{}`", rest.trim_end())
    };
    format!("{}: {place}", outside_language(source))
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Int(i64),
    Float(f64),
    Str(String),
    Name(String),
    Op(&'static str),
}

pub(crate) fn tokenize(s: &str) -> Option<Vec<Tok>> {
    tokenize_at(s).ok().map(|(tokens, _)| tokens)
}

/// The tokens and the byte offset each starts at, or the offset of what is
/// not a token.
fn tokenize_at(s: &str) -> Result<(Vec<Tok>, Vec<usize>), usize> {
    const OPS: [&str; 20] = [
        "**", "//", "==", "!=", "<=", ">=", "(", ")", ",", ".", "+", "-", "*", "/", "%", "<", ">",
        "~", "[", "]",
    ];
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let mut offsets = Vec::new();
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            offsets.push(start);
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'_') {
                i += 1;
            }
            let mut is_float = false;
            if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
                is_float = true;
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
                is_float = true;
                i += 1;
                if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
                    i += 1;
                }
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text = s[start..i].replace('_', "");
            out.push(if is_float {
                Tok::Float(text.parse().map_err(|_| start)?)
            } else {
                Tok::Int(text.parse().map_err(|_| start)?)
            });
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            offsets.push(start);
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Name(s[start..i].to_string()));
        } else if c == '\'' || c == '"' {
            let end = s[i + 1..].find(c).ok_or(i)? + i + 1;
            let text = &s[i + 1..end];
            if text.contains('\\') {
                return Err(i);
            }
            offsets.push(i);
            out.push(Tok::Str(text.to_string()));
            i = end + 1;
        } else {
            let op = OPS.iter().find(|op| s[i..].starts_with(**op)).ok_or(i)?;
            offsets.push(i);
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Ok((out, offsets))
}

struct Parser<'a, 's> {
    tokens: Vec<Tok>,
    pos: usize,
    scope: &'a Scope<'s>,
    /// Whether what was parsed last is a string literal (or one in
    /// brackets): arithmetic on one is refused, since minijinja, which
    /// parses an expression after this parser accepts it, folds constants
    /// as it parses, and `'x' * 99999999 + ...` would allocate gigabytes.
    string_literal: bool,
    /// The furthest token looked at: where reading stopped, when it does.
    seen: std::cell::Cell<usize>,
}

impl Parser<'_, '_> {
    fn peek(&self) -> Option<&Tok> {
        self.seen.set(self.seen.get().max(self.pos));
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

    // expr := or ['if' or ['else' expr]]
    fn expr(&mut self) -> Option<Eval> {
        let then = self.or()?;
        if !self.eat_name("if") {
            return Some(then);
        }
        let cond = self.or()?;
        let otherwise: Eval = if self.eat_name("else") {
            self.expr()?
        } else {
            Box::new(|_| Ok(Val::None))
        };
        Some(Box::new(move |s| {
            if cond(s)?.truthy() {
                then(s)
            } else {
                otherwise(s)
            }
        }))
    }

    fn or(&mut self) -> Option<Eval> {
        let mut left = self.and()?;
        while self.eat_name("or") {
            let right = self.and()?;
            left = Box::new(move |s| {
                let l = left(s)?;
                if l.truthy() {
                    Ok(l)
                } else {
                    right(s)
                }
            });
        }
        Some(left)
    }

    fn and(&mut self) -> Option<Eval> {
        let mut left = self.not()?;
        while self.eat_name("and") {
            let right = self.not()?;
            left = Box::new(move |s| {
                let l = left(s)?;
                if !l.truthy() {
                    Ok(l)
                } else {
                    right(s)
                }
            });
        }
        Some(left)
    }

    fn not(&mut self) -> Option<Eval> {
        if self.eat_name("not") {
            let inner = self.not()?;
            return Some(Box::new(move |s| Ok(Val::Bool(!inner(s)?.truthy()))));
        }
        self.compare()
    }

    /// `name is defined`, `name is not defined`: whether the scope holds the name.
    fn defined_test(&mut self) -> Option<Eval> {
        let name = match self.tokens.get(self.pos..self.pos + 3) {
            Some([Tok::Name(n), Tok::Name(is), _]) if is == "is" => n.clone(),
            _ => return None,
        };
        let negated = matches!(self.tokens.get(self.pos + 2), Some(Tok::Name(n)) if n == "not");
        let at = self.pos + 2 + usize::from(negated);
        if !matches!(self.tokens.get(at), Some(Tok::Name(d)) if d == "defined") {
            return None;
        }
        self.pos = at + 1;
        let known =
            self.scope.slots.contains_key(&name) || self.scope.constants.contains_key(&name);
        let value = known != negated;
        Some(Box::new(move |_| Ok(Val::Bool(value))))
    }

    /// `[a, b, ...]` after `in`: the items, each an expression.
    fn list(&mut self) -> Option<Vec<Eval>> {
        if !self.eat_op("[") {
            return None;
        }
        let mut items = Vec::new();
        if self.eat_op("]") {
            return Some(items);
        }
        loop {
            items.push(self.or()?);
            if self.eat_op("]") {
                return Some(items);
            }
            if !self.eat_op(",") {
                return None;
            }
        }
    }

    fn compare(&mut self) -> Option<Eval> {
        if let Some(test) = self.defined_test() {
            return Some(test);
        }
        let left = self.additive()?;
        let negated_in = matches!(
            (self.tokens.get(self.pos), self.tokens.get(self.pos + 1)),
            (Some(Tok::Name(n)), Some(Tok::Name(i))) if n == "not" && i == "in"
        );
        if negated_in || matches!(self.peek(), Some(Tok::Name(n)) if n == "in") {
            self.pos += 1 + usize::from(negated_in);
            let items: Arc<[Eval]> = self.list()?.into();
            return Some(Box::new(move |s| {
                let x = left(s)?;
                let mut found = false;
                for item in items.iter() {
                    if compare("==", &x, &item(s)?)?.truthy() {
                        found = true;
                        break;
                    }
                }
                Ok(Val::Bool(found != negated_in))
            }));
        }
        for op in ["==", "!=", "<=", ">=", "<", ">"] {
            if self.eat_op(op) {
                let right = self.additive()?;
                // Chained comparisons mean something else in Jinja; leave them to minijinja.
                if ["==", "!=", "<=", ">=", "<", ">"]
                    .iter()
                    .any(|o| matches!(self.peek(), Some(Tok::Op(p)) if p == o))
                {
                    return None;
                }
                return Some(Box::new(move |s| compare(op, &left(s)?, &right(s)?)));
            }
        }
        if matches!(self.peek(), Some(Tok::Name(n)) if n == "in" || n == "is") {
            return None;
        }
        Some(left)
    }

    fn additive(&mut self) -> Option<Eval> {
        let mut left = self.multiplicative()?;
        loop {
            let op = if self.eat_op("+") {
                "+"
            } else if self.eat_op("-") {
                "-"
            } else if self.eat_op("~") {
                return None;
            } else {
                return Some(left);
            };
            let left_string = self.string_literal;
            let right = self.multiplicative()?;
            if left_string || self.string_literal {
                return None;
            }
            left = Box::new(move |s| arith(op, &left(s)?, &right(s)?));
        }
    }

    fn multiplicative(&mut self) -> Option<Eval> {
        let mut left = self.power()?;
        loop {
            let op = ["//", "*", "/", "%"].into_iter().find(|op| self.eat_op(op));
            let Some(op) = op else { return Some(left) };
            let left_string = self.string_literal;
            let right = self.power()?;
            if left_string || self.string_literal {
                return None;
            }
            left = Box::new(move |s| arith(op, &left(s)?, &right(s)?));
        }
    }

    // Jinja binds a sign tighter than `**` (`-2 ** 2` is 4, unlike Python),
    // and minijinja follows it: power := unary ['**' unary].
    fn power(&mut self) -> Option<Eval> {
        let base = self.unary()?;
        if self.eat_op("**") {
            let base_string = self.string_literal;
            let exp = self.unary()?;
            if base_string || self.string_literal {
                return None;
            }
            self.string_literal = false;
            return Some(Box::new(move |s| arith("**", &base(s)?, &exp(s)?)));
        }
        Some(base)
    }

    fn unary(&mut self) -> Option<Eval> {
        if self.eat_op("-") {
            let inner = self.unary()?;
            if self.string_literal {
                return None;
            }
            return Some(Box::new(move |s| arith("-", &Val::Int(0), &inner(s)?)));
        }
        if self.eat_op("+") {
            return self.unary();
        }
        self.primary()
    }

    fn primary(&mut self) -> Option<Eval> {
        let tok = self.peek()?.clone();
        self.pos += 1;
        // A bracketed expression keeps what its inside set.
        if !matches!(tok, Tok::Op("(")) {
            self.string_literal = matches!(tok, Tok::Str(_));
        }
        let node: Eval = match tok {
            Tok::Int(i) => Box::new(move |_| Ok(Val::Int(i))),
            Tok::Float(f) => Box::new(move |_| Ok(Val::Float(f))),
            Tok::Str(text) => {
                let v = Val::Str(Arc::from(text.as_str()));
                Box::new(move |_| Ok(v.clone()))
            }
            Tok::Op("(") => {
                let inner = self.expr()?;
                if !self.eat_op(")") {
                    return None;
                }
                inner
            }
            Tok::Name(name) => match name.as_str() {
                "true" | "True" => Box::new(|_| Ok(Val::Bool(true))),
                "false" | "False" => Box::new(|_| Ok(Val::Bool(false))),
                "none" | "None" => Box::new(|_| Ok(Val::None)),
                _ if self.eat_op("(") => self.call(&name)?,
                _ if self.eat_op(".") => {
                    let Some(Tok::Name(attr)) = self.peek().cloned() else {
                        return None;
                    };
                    self.pos += 1;
                    let key = format!("{name}.{attr}");
                    match self.scope.constants.get(&key).cloned() {
                        Some(v) => Box::new(move |_| Ok(v.clone())),
                        None => Box::new(move |_| Err(format!("`{key}` is not defined"))),
                    }
                }
                _ if self.eat_op("[") => {
                    // `name[i]`: an item of a list-valued field (path templates).
                    let Some(Tok::Int(i)) = self.peek().cloned() else {
                        return None;
                    };
                    self.pos += 1;
                    if !self.eat_op("]") {
                        return None;
                    }
                    let key = format!("{name}[{i}]");
                    match self.scope.constants.get(&key).cloned() {
                        Some(v) => Box::new(move |_| Ok(v.clone())),
                        None => Box::new(move |_| Err(format!("`{key}` is not defined"))),
                    }
                }
                _ => {
                    if let Some(v) = self.scope.constants.get(&name).cloned() {
                        Box::new(move |_| Ok(v.clone()))
                    } else if let Some(&slot) = self.scope.slots.get(&name) {
                        Box::new(move |s| Ok(s[slot].clone()))
                    } else {
                        Box::new(move |_| Err(format!("`{name}` is not defined")))
                    }
                }
            },
            Tok::Op(_) => return None,
        };
        if matches!(self.peek(), Some(Tok::Op("[" | "."))) {
            return None;
        }
        Some(node)
    }

    fn call(&mut self, name: &str) -> Option<Eval> {
        let mut args = Vec::new();
        if !self.eat_op(")") {
            loop {
                args.push(self.expr()?);
                if self.eat_op(")") {
                    break;
                }
                if !self.eat_op(",") {
                    return None;
                }
            }
        }
        let args: Arc<[Eval]> = args.into();
        let f: Eval = match (name, args.len()) {
            ("min", n) if n >= 1 => Box::new(move |s| pick(&args, s, |a, b| b < a)),
            ("max", n) if n >= 1 => Box::new(move |s| pick(&args, s, |a, b| b > a)),
            ("abs", 1) => Box::new(move |s| match args[0](s)? {
                Val::Int(i) => i
                    .checked_abs()
                    .map(Val::Int)
                    .ok_or_else(|| format!("integer overflow in abs({i})")),
                v => Ok(Val::Float(v.num().ok_or("abs of a non-number")?.abs())),
            }),
            ("ceil_div", 2) => Box::new(move |s| match (args[0](s)?, args[1](s)?) {
                (Val::Int(a), Val::Int(b)) => ceil_div(a, b).map(Val::Int),
                _ => Err("ceil_div takes integers".to_string()),
            }),
            ("log2", 1) => Box::new(move |s| {
                Ok(Val::Float(
                    args[0](s)?.num().ok_or("log2 of a non-number")?.log2(),
                ))
            }),
            ("is_pow2", 1) => Box::new(move |s| match args[0](s)? {
                Val::Int(x) => Ok(Val::Bool(x > 0 && (x & (x - 1)) == 0)),
                _ => Err("is_pow2 takes an integer".to_string()),
            }),
            _ => return None,
        };
        Some(f)
    }
}

fn pick(args: &[Eval], s: &[Val], better: fn(f64, f64) -> bool) -> Result<Val, String> {
    let mut best = args[0](s)?;
    let mut best_n = best.num().ok_or("min/max of a non-number")?;
    for a in &args[1..] {
        let v = a(s)?;
        let n = v.num().ok_or("min/max of a non-number")?;
        if better(best_n, n) {
            best = v;
            best_n = n;
        }
    }
    Ok(best)
}

pub(crate) fn compare(op: &str, a: &Val, b: &Val) -> Result<Val, String> {
    use std::cmp::Ordering;
    let ord = match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::None, Val::None) => Some(Ordering::Equal),
        _ => match (a.num(), b.num()) {
            (Some(x), Some(y)) => x.partial_cmp(&y),
            _ => None,
        },
    };
    let result = match (op, ord) {
        ("==", o) => o == Some(Ordering::Equal),
        ("!=", o) => o != Some(Ordering::Equal),
        (_, None) => return Err(format!("cannot compare {a:?} and {b:?}")),
        ("<", Some(o)) => o == Ordering::Less,
        ("<=", Some(o)) => o != Ordering::Greater,
        (">", Some(o)) => o == Ordering::Greater,
        (">=", Some(o)) => o != Ordering::Less,
        _ => unreachable!("unknown comparison {op}"),
    };
    Ok(Val::Bool(result))
}

pub(crate) fn arith(op: &str, a: &Val, b: &Val) -> Result<Val, String> {
    if let (Val::Int(x), Val::Int(y)) = (a, b) {
        let (x, y) = (*x, *y);
        let overflow = || format!("integer overflow in {x} {op} {y}");
        return match op {
            "+" => x.checked_add(y).map(Val::Int).ok_or_else(overflow),
            "-" => x.checked_sub(y).map(Val::Int).ok_or_else(overflow),
            "*" => x.checked_mul(y).map(Val::Int).ok_or_else(overflow),
            "/" if y == 0 => Err("division by zero".into()),
            "/" => Ok(Val::Float(x as f64 / y as f64)),
            "//" | "%" if y == 0 => Err("division by zero".into()),
            // i64::MIN // -1 has no i64 answer.
            "//" => x.checked_div_euclid(y).map(Val::Int).ok_or_else(overflow),
            "%" => x.checked_rem_euclid(y).map(Val::Int).ok_or_else(overflow),
            "**" if y >= 0 => u32::try_from(y)
                .ok()
                .and_then(|y| x.checked_pow(y))
                .map(Val::Int)
                .ok_or_else(overflow),
            "**" => Ok(Val::Float((x as f64).powf(y as f64))),
            _ => unreachable!("unknown operator {op}"),
        };
    }
    let (Some(x), Some(y)) = (a.num(), b.num()) else {
        return Err(format!("cannot apply {op} to {a:?} and {b:?}"));
    };
    Ok(Val::Float(match op {
        "+" => x + y,
        "-" => x - y,
        "*" => x * y,
        "/" => x / y,
        "//" => (x / y).floor(),
        "%" => x.rem_euclid(y),
        "**" => x.powf(y),
        _ => unreachable!("unknown operator {op}"),
    }))
}

mod render;
pub use render::render_path;

#[cfg(test)]
mod tests;

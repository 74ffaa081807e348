//! `--only E=32,N=2880,method=triton`: restrict a run or plan to a subset.

use std::collections::HashSet;

use serde_json::Value as Json;

use crate::diag::{did_you_mean, Diagnostic};
use crate::manifest::{scalar_text, Experiment, Shape};

/// Conditions by key; values of the same key are alternatives.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    terms: Vec<(String, Vec<String>)>,
    origin: String,
}

impl Filter {
    pub fn parse(text: &str) -> Result<Filter, Diagnostic> {
        let origin = format!("--only {text}");
        let mut terms: Vec<(String, Vec<String>)> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(Diagnostic::in_file(
                    origin.as_ref(),
                    format!("`{part}` is not key=value"),
                )
                .help("write --only E=32,N=2880 (repeat a key for alternatives: M=1,M=2)"));
            };
            let (key, value) = (key.trim().to_string(), value.trim().to_string());
            match terms.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => terms.push((key, vec![value])),
            }
        }
        Ok(Filter { terms, origin })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// How the filter was written: `--only E=32,N=2880`.
    pub fn origin(&self) -> String {
        self.origin.clone()
    }

    /// What each filtered key can be in this experiment, for a filter that
    /// matched nothing: `E in {8}, N in {32}`.
    pub fn choices(&self, exp: &Experiment, shapes: &[Shape]) -> String {
        let mut parts = Vec::new();
        for (key, _) in &self.terms {
            let mut values: Vec<String> = Vec::new();
            let mut add = |v: String| {
                if !values.contains(&v) {
                    values.push(v);
                }
            };
            if key == "method" {
                exp.methods.iter().for_each(|m| add(m.name.clone()));
            }
            for s in shapes {
                if let Some(v) = s.get(key) {
                    add(scalar_text(v));
                }
            }
            for m in &exp.methods {
                for a in m.axes.iter().filter(|a| &a.name == key) {
                    a.values.iter().for_each(|v| add(scalar_text(v)));
                }
                if let Some(v) = m.params.get(key) {
                    add(scalar_text(v));
                }
            }
            parts.push(format!("{key} in {{{}}}", values.join(", ")));
        }
        parts.join(", ")
    }

    /// Every key must name a shape field, `method`, or a space parameter.
    pub fn check_keys(&self, exp: &Experiment, shapes: &[Shape]) -> Result<(), Diagnostic> {
        let mut known: HashSet<String> = HashSet::from(["method".to_string()]);
        for s in shapes {
            known.extend(s.keys().cloned());
        }
        for m in &exp.methods {
            known.extend(m.axes.iter().map(|a| a.name.clone()));
            known.extend(m.params.keys().cloned());
        }
        for (key, _) in &self.terms {
            if !known.contains(key) {
                let mut names: Vec<&str> = known.iter().map(String::as_str).collect();
                names.sort();
                let help = match did_you_mean(key, names.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("filter on: {}", names.join(", ")),
                };
                return Err(Diagnostic::in_file(
                    self.origin.as_ref(),
                    format!("unknown filter key `{key}`"),
                )
                .help(help));
            }
        }
        if let Some((_, methods)) = self.terms.iter().find(|(k, _)| k == "method") {
            for m in methods {
                if !exp.methods.iter().any(|x| x.name == *m) {
                    let names: Vec<&str> = exp.methods.iter().map(|m| m.name.as_str()).collect();
                    return Err(Diagnostic::in_file(
                        self.origin.as_ref(),
                        format!("no method `{m}` in this experiment"),
                    )
                    .help(format!("methods: {}", names.join(", "))));
                }
            }
        }
        Ok(())
    }

    pub fn keeps_shape(&self, shape: &Shape) -> bool {
        self.terms.iter().all(|(k, values)| match shape.get(k) {
            Some(v) => values.iter().any(|want| matches(v, want)),
            None => true,
        })
    }

    pub fn keeps_method(&self, name: &str) -> bool {
        self.terms
            .iter()
            .all(|(k, values)| k != "method" || values.iter().any(|v| v == name))
    }

    /// Space values of a filtered parameter; others pass.
    pub fn keeps_value(&self, param: &str, value: &Json) -> bool {
        self.terms
            .iter()
            .all(|(k, values)| k != param || values.iter().any(|want| matches(value, want)))
    }
}

fn matches(value: &Json, want: &str) -> bool {
    if scalar_text(value) == want {
        return true;
    }
    match (value.as_f64(), want.parse::<f64>()) {
        (Some(a), Ok(b)) => a == b,
        _ => false,
    }
}

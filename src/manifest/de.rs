//! Serde `Deserializer` over a spanned [`Node`] tree.
//!
//! Errors carry the span of the innermost node that failed, unknown keys are
//! caught here (serde tells us the field names a struct accepts) with a "did
//! you mean", and type errors say what was expected and what was found.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::yaml::{Node, Value};
use crate::diag::{did_you_mean, Diagnostic, Span};

#[derive(Debug)]
pub struct DeError {
    span: Option<Span>,
    message: String,
    help: Option<String>,
}

impl DeError {
    fn at(span: Span, message: String, help: Option<String>) -> Self {
        DeError {
            span: Some(span),
            message,
            help,
        }
    }

    fn or_span(mut self, span: Span) -> Self {
        self.span.get_or_insert(span);
        self
    }

    pub fn into_diagnostic(self) -> Diagnostic {
        let span = self.span.unwrap_or_default();
        let mut d = Diagnostic::at(span, self.message);
        d.help = self.help;
        d
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            span: None,
            message: msg.to_string(),
            help: None,
        }
    }

    fn invalid_type(unexp: de::Unexpected, exp: &dyn de::Expected) -> Self {
        let found = match unexp {
            de::Unexpected::Map => "a mapping".to_string(),
            de::Unexpected::Seq => "a list".to_string(),
            other => other.to_string(),
        };
        DeError {
            span: None,
            message: format!(
                "expected {}, found {found}",
                plain_expected(&exp.to_string())
            ),
            help: None,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        DeError {
            span: None,
            message: format!("missing required key `{field}`"),
            help: Some(format!("add `{field}:` to this mapping")),
        }
    }
}

pub fn from_node<'de, T: de::Deserialize<'de>>(node: &'de Node) -> Result<T, Diagnostic> {
    T::deserialize(NodeDe(node)).map_err(|e| e.or_span(node.span).into_diagnostic())
}

struct NodeDe<'a>(&'a Node);

impl<'de> NodeDe<'de> {
    fn visit<V: Visitor<'de>>(&self, visitor: V) -> Result<V::Value, DeError> {
        let node = self.0;
        let result = match &node.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Seq(items) => visitor.visit_seq(SeqDe {
                items: items.iter(),
            }),
            Value::Map(entries) => visitor.visit_map(MapDe {
                entries,
                index: 0,
                value: None,
            }),
        };
        result.map_err(|e| e.or_span(node.span))
    }
}

impl<'de> de::Deserializer<'de> for NodeDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.visit(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if let Value::Map(entries) = &self.0.value {
            for (key, _) in entries {
                if !fields.contains(&key.name.as_str()) {
                    let help = match did_you_mean(&key.name, fields.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None => format!("keys allowed here: {}", fields.join(", ")),
                    };
                    return Err(DeError::at(
                        key.span,
                        format!("unknown key `{}` in {}", key.name, describe(name)),
                        Some(help),
                    ));
                }
            }
        }
        self.visit(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let node = self.0;
        match &node.value {
            Value::Str(s) => {
                if !variants.contains(&s.as_str()) {
                    let help = match did_you_mean(s, variants.iter().copied()) {
                        Some(v) => format!("did you mean `{v}`?"),
                        None => format!("use one of: {}", variants.join(", ")),
                    };
                    return Err(DeError::at(
                        node.span,
                        format!("unknown value `{s}`"),
                        Some(help),
                    ));
                }
                visitor
                    .visit_enum(s.as_str().into_deserializer())
                    .map_err(|e: DeError| e.or_span(node.span))
            }
            Value::Map(entries) if entries.len() == 1 => {
                let (key, value) = &entries[0];
                if !variants.contains(&key.name.as_str()) {
                    let help = format!("use one of: {}", variants.join(", "));
                    return Err(DeError::at(
                        key.span,
                        format!("unknown variant `{}`", key.name),
                        Some(help),
                    ));
                }
                visitor
                    .visit_enum(EnumDe {
                        key: &key.name,
                        value,
                    })
                    .map_err(|e| e.or_span(node.span))
            }
            _ => Err(DeError::at(
                node.span,
                format!(
                    "expected one of {}, found {}",
                    variants.join(", "),
                    node.kind()
                ),
                None,
            )),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Plain scalars like `fp16` or `1.5` may be meant as text; numbers and
        // booleans are accepted where a string is expected.
        let node = self.0;
        match &node.value {
            Value::Int(i) => visitor.visit_string(i.to_string()),
            Value::Float(f) => visitor.visit_string(f.to_string()),
            Value::Bool(b) => visitor.visit_string(b.to_string()),
            _ => self.visit(visitor),
        }
        .map_err(|e| e.or_span(node.span))
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_string(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// serde's names for primitive types, in words a manifest author uses.
fn plain_expected(exp: &str) -> String {
    match exp {
        "f64" | "f32" => "a number".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number (0 or more)".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "a boolean" | "bool" => "true or false".into(),
        other => other.to_string(),
    }
}

/// Type names in messages: `RawTolerance` -> "tolerance".
fn describe(type_name: &str) -> String {
    let base = type_name.strip_prefix("Raw").unwrap_or(type_name);
    let mut out = String::new();
    for (i, c) in base.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

struct SeqDe<'a> {
    items: std::slice::Iter<'a, Node>,
}

impl<'de> SeqAccess<'de> for SeqDe<'de> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some(node) => seed
                .deserialize(NodeDe(node))
                .map(Some)
                .map_err(|e| e.or_span(node.span)),
            None => Ok(None),
        }
    }
}

struct MapDe<'a> {
    entries: &'a [(super::yaml::Key, Node)],
    index: usize,
    value: Option<&'a Node>,
}

impl<'de> MapAccess<'de> for MapDe<'de> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((key, value)) = self.entries.get(self.index) else {
            return Ok(None);
        };
        self.index += 1;
        self.value = Some(value);
        let de: de::value::BorrowedStrDeserializer<'de, DeError> =
            de::value::BorrowedStrDeserializer::new(&key.name);
        seed.deserialize(de)
            .map(Some)
            .map_err(|e| e.or_span(key.span))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let node = self.value.take().expect("value requested before key");
        seed.deserialize(NodeDe(node))
            .map_err(|e| e.or_span(node.span))
    }
}

struct EnumDe<'a> {
    key: &'a str,
    value: &'a Node,
}

impl<'de> de::EnumAccess<'de> for EnumDe<'de> {
    type Error = DeError;
    type Variant = NodeDe<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, NodeDe<'de>), DeError> {
        let de: de::value::BorrowedStrDeserializer<'de, DeError> =
            de::value::BorrowedStrDeserializer::new(self.key);
        Ok((seed.deserialize(de)?, NodeDe(self.value)))
    }
}

impl<'de> de::VariantAccess<'de> for NodeDe<'de> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

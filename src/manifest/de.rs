//! Serde `Deserializer` over a spanned [`Node`] tree.
//!
//! Errors carry the span of the innermost node that failed, unknown keys are
//! caught here (serde tells us the field names a struct accepts) with a "did
//! you mean", and type errors say what was expected and what was found.
//!
//! [`Spanned<T>`] fields receive the span of the node (or mapping key) they
//! were read from, and a [`Node`] field receives the node itself with every
//! span inside it: the raw manifest types carry their places with them, so
//! validation points at the right line without looking anything up again.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::yaml::{Key, Node, Value};
use crate::diag::{did_you_mean, Diagnostic, FileId, Span};

/// The struct name through which [`Spanned`] asks this deserializer for a span.
const SPANNED: &str = "$tunelab::Spanned";
const SPANNED_FIELDS: &[&str] = &["$span", "$value"];

/// A value with the place in the manifest it was written.
///
/// Only the manifest's own deserializer can produce one; it serialises as the
/// bare value, so a manifest's canonical JSON (and its hash) holds no spans.
#[derive(Debug, Clone)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Spanned<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Spanned<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state)
    }
}

impl<T: Serialize> Serialize for Spanned<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SpannedVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for SpannedVisitor<T> {
            type Value = Spanned<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value read from a manifest")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spanned<T>, A::Error> {
                let missing =
                    || de::Error::custom("a spanned value needs the manifest's deserializer");
                map.next_key::<&str>()?.ok_or_else(missing)?;
                let (file, line, col): (u32, usize, usize) = map.next_value()?;
                map.next_key::<&str>()?.ok_or_else(missing)?;
                let value = map.next_value()?;
                Ok(Spanned {
                    value,
                    span: Span {
                        file: FileId::from_raw(file),
                        line,
                        col,
                    },
                })
            }
        }
        d.deserialize_struct(SPANNED, SPANNED_FIELDS, SpannedVisitor(PhantomData))
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Spanned<T> {
    fn schema_name() -> String {
        T::schema_name()
    }
    fn json_schema(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        T::json_schema(gen)
    }
    fn is_referenceable() -> bool {
        T::is_referenceable()
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Spanned { value, span } = Spanned::<Value>::deserialize(d)?;
        Ok(Node { value, span })
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_none<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
                Ok(Value::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
                Ok(Value::Int(i))
            }
            fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
                i64::try_from(u)
                    .map(Value::Int)
                    .map_err(|_| E::custom(format!("{u} is too large")))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
                Ok(Value::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Value, E> {
                Ok(Value::Str(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
                let mut items = Vec::new();
                while let Some(node) = seq.next_element::<Node>()? {
                    items.push(node);
                }
                Ok(Value::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    let value: Node = map.next_value()?;
                    entries.push((
                        Key {
                            name: key.value,
                            span: key.span,
                        },
                        value,
                    ));
                }
                Ok(Value::Map(entries))
            }
        }
        d.deserialize_any(ValueVisitor)
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match &self.value {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(&k.name, v)?;
                }
                map.end()
            }
        }
    }
}

impl schemars::JsonSchema for Node {
    fn schema_name() -> String {
        "AnyValue".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        schemars::schema::Schema::Bool(true)
    }
}

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

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
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

pub fn from_node<'de, T: Deserialize<'de>>(node: &'de Node) -> Result<T, Diagnostic> {
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

impl<'de> Deserializer<'de> for NodeDe<'de> {
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
        if name == SPANNED {
            return visitor.visit_map(SpannedAccess {
                span: self.0.span,
                inner: Some(Inner::Node(self.0)),
                span_sent: false,
            });
        }
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
    entries: &'a [(Key, Node)],
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
        seed.deserialize(KeyDe(key))
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
        Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

/// A mapping key: a string, or a [`Spanned`] string with the key's own span.
struct KeyDe<'a>(&'a Key);

impl<'de> Deserializer<'de> for KeyDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_borrowed_str(&self.0.name)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED {
            return visitor.visit_map(SpannedAccess {
                span: self.0.span,
                inner: Some(Inner::Key(&self.0.name)),
                span_sent: false,
            });
        }
        self.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string option
        bytes byte_buf unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

enum Inner<'a> {
    Node(&'a Node),
    Key(&'a str),
}

/// The two entries a [`Spanned`] reads: `$span` (file, line, column), then `$value`.
struct SpannedAccess<'a> {
    span: Span,
    inner: Option<Inner<'a>>,
    span_sent: bool,
}

impl<'de> MapAccess<'de> for SpannedAccess<'de> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let key = if !self.span_sent {
            SPANNED_FIELDS[0]
        } else if self.inner.is_some() {
            SPANNED_FIELDS[1]
        } else {
            return Ok(None);
        };
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        if !self.span_sent {
            self.span_sent = true;
            let s = self.span;
            let parts = [u64::from(s.file.raw()), s.line as u64, s.col as u64];
            return seed.deserialize(de::value::SeqDeserializer::new(parts.into_iter()));
        }
        match self.inner.take().expect("value requested twice") {
            Inner::Node(node) => seed
                .deserialize(NodeDe(node))
                .map_err(|e| e.or_span(node.span)),
            Inner::Key(name) => seed
                .deserialize(de::value::BorrowedStrDeserializer::new(name))
                .map_err(|e: DeError| e.or_span(self.span)),
        }
    }
}

/// A span, or `fallback` for a value that was not written (a default).
pub(super) fn place(span: Span, fallback: Span) -> Span {
    if span.line == 0 {
        fallback
    } else {
        span
    }
}

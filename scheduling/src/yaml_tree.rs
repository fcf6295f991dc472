//! A YAML (or JSON) document as a tree whose every value remembers its line.
//!
//! serde's derived structs either refuse unknown keys or drop them silently, and their type errors
//! name neither the key path nor (through `flatten`) the line. The device configuration needs all
//! three: a bad value named by key and line, unknown keys collected and listed. So the document is
//! read once into this tree and the configuration is read from the tree by hand.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::Ratio;

/// What a scalar was written as; decides how it is quoted in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Str,
    Number,
    Bool,
    Null,
}

/// One value of the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Scalar(Kind, String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A value and the line it starts on (1-based; 0 when the parser could not tell).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub value: Value,
    pub line: u64,
}

/// A bad value: its line, its key path (`nvidia.deviceSplitCount`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bad {
    pub line: u64,
    pub key: String,
    pub reason: String,
}

impl Bad {
    pub fn new(node: &Node, key: &str, reason: impl Into<String>) -> Self {
        Self { line: node.line, key: key.to_owned(), reason: reason.into() }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Value>::deserialize(d)?;
        Ok(Self { value: spanned.value, line: spanned.referenced.line() })
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Bool, v.to_string()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Number, v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Number, v.to_string()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Number, v.to_string()))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Number, v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Number, v.to_string()))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Str, v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Str, v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Null, String::new()))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Scalar(Kind::Null, String::new()))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Node>()? {
            let value = map.next_value::<Node>()?;
            entries.push((key, value));
        }
        Ok(Value::Map(entries))
    }
}

impl Node {
    /// The value as a message shows it after "got": `"ten"`, `12`, `a list`.
    fn shown(&self) -> String {
        match &self.value {
            Value::Scalar(Kind::Str, s) => format!("{s:?}"),
            Value::Scalar(Kind::Null, _) => "nothing".into(),
            Value::Scalar(_, s) => s.clone(),
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a mapping".into(),
        }
    }

    fn expected(&self, key: &str, what: &str) -> Bad {
        Bad::new(self, key, format!("expected {what}, got {}", self.shown()))
    }

    fn is_null(&self) -> bool {
        matches!(self.value, Value::Scalar(Kind::Null, _))
    }

    /// A key's text (keys are scalars in every file we read).
    pub fn key_text(&self) -> String {
        match &self.value {
            Value::Scalar(_, s) => s.clone(),
            _ => self.shown(),
        }
    }

    /// The entries of a mapping; an empty value (`key:`) reads as no entries.
    pub fn map(&self, key: &str) -> Result<&[(Node, Node)], Bad> {
        match &self.value {
            Value::Map(entries) => Ok(entries),
            _ if self.is_null() => Ok(&[]),
            _ => Err(self.expected(key, "a mapping")),
        }
    }

    /// The items of a list; an empty value reads as no items.
    pub fn seq(&self, key: &str) -> Result<&[Node], Bad> {
        match &self.value {
            Value::Seq(items) => Ok(items),
            _ if self.is_null() => Ok(&[]),
            _ => Err(self.expected(key, "a list")),
        }
    }

    /// A non-empty text; numbers are taken as written (a model named `3090` needs no quotes).
    pub fn text(&self, key: &str) -> Result<String, Bad> {
        match &self.value {
            Value::Scalar(Kind::Str | Kind::Number, s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
            _ => Err(self.expected(key, "a non-empty string")),
        }
    }

    /// A whole number in `min..=max`; a quoted number is accepted as HAMi's Go reader does.
    pub fn int(&self, key: &str, min: u64, max: u64) -> Result<u64, Bad> {
        let n = match &self.value {
            Value::Scalar(Kind::Str | Kind::Number, s) => s.trim().parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| self.expected(key, "an integer"))?;
        if n < min || n > max {
            return Err(Bad::new(self, key, format!("{n} is outside {min}..={max}")));
        }
        Ok(n)
    }

    /// [`Node::int`] for `u32` settings.
    pub fn int32(&self, key: &str, min: u32, max: u32) -> Result<u32, Bad> {
        let n = self.int(key, u64::from(min), u64::from(max))?;
        u32::try_from(n).map_err(|_| Bad::new(self, key, format!("{n} is too large")))
    }

    /// A scaling factor of at least 1, kept exact.
    pub fn ratio(&self, key: &str) -> Result<Ratio, Bad> {
        match &self.value {
            Value::Scalar(Kind::Str | Kind::Number, s) => {
                // Ratio names its key in the error; the tree names the full path and line instead.
                Ratio::parse("ratio", s.trim()).map_err(|e| Bad::new(self, key, e.reason))
            }
            _ => Err(self.expected(key, "a number")),
        }
    }

    /// A list of `u32`s (`index: [0, 3]`).
    pub fn int32_list(&self, key: &str) -> Result<Vec<u32>, Bad> {
        self.seq(key)?.iter().map(|n| n.int32(key, 0, u32::MAX)).collect()
    }

    /// A list of texts, or one text standing for a list of one (`name: n1`).
    pub fn text_list(&self, key: &str) -> Result<Vec<String>, Bad> {
        match &self.value {
            Value::Seq(items) => items.iter().map(|n| n.text(key)).collect(),
            _ => Ok(vec![self.text(key)?]),
        }
    }
}

/// Reads `text` into a tree; an empty document is an empty mapping.
///
/// # Errors
/// The parser's one-line message (`line 1 column 9: unclosed bracket '['`) when the text is not
/// YAML; the source snippet is left out so command-line errors stay on one line.
pub(crate) fn parse(text: &str) -> Result<Node, String> {
    if text.trim().is_empty() {
        return Ok(Node { value: Value::Map(Vec::new()), line: 1 });
    }
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| {
        let message = e.to_string();
        message.strip_prefix("error: ").unwrap_or(&message).trim().to_owned()
    })
}

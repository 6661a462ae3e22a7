//! One JSON value as the proto3 JSON rules see it when it stands for a
//! scalar: the rules in `parse.rs` read a token, and an array or an object
//! where a scalar belongs is only named (in "expected X, got array").

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token<'a> {
    Null,
    Bool(bool),
    /// Integers without a fraction or exponent stay exact.
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    /// Borrowed from the input when it holds no escapes.
    String(Cow<'a, str>),
    /// An array, already skipped.
    Array,
    /// An object, already skipped.
    Object,
}

impl Token<'_> {
    /// How the value is named in "expected X, got Y" errors.
    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            Token::Null => "null",
            Token::Bool(_) => "boolean",
            Token::Unsigned(_) | Token::Signed(_) | Token::Float(_) => "number",
            Token::String(_) => "string",
            Token::Array => "array",
            Token::Object => "object",
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Token<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TokenVisitor)
    }
}

struct TokenVisitor;

impl<'de> Visitor<'de> for TokenVisitor {
    type Value = Token<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Token<'de>, E> {
        Ok(Token::Null)
    }

    fn visit_none<E>(self) -> Result<Token<'de>, E> {
        Ok(Token::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Token<'de>, E> {
        Ok(Token::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Token<'de>, E> {
        Ok(Token::Unsigned(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Token<'de>, E> {
        Ok(Token::Signed(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Token<'de>, E> {
        Ok(Token::Float(v))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Token<'de>, E> {
        Ok(Token::String(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Token<'de>, E> {
        Ok(Token::String(Cow::Owned(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Token<'de>, E> {
        Ok(Token::String(Cow::Owned(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Token<'de>, A::Error> {
        skip_array(seq)?;
        Ok(Token::Array)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Token<'de>, A::Error> {
        skip_object(map)?;
        Ok(Token::Object)
    }
}

/// Reads an array to its end, keeping nothing.
pub(crate) fn skip_array<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Reads an object to its end, keeping nothing.
pub(crate) fn skip_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// An object's key, borrowed from the input when it holds no escapes.
pub(crate) struct Key<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(v)))
    }
}

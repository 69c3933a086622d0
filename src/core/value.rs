//! Typed header values: what an AMQP field table holds, kept exactly through routing,
//! storage and delivery (Celery and the Java client put integers, booleans, arrays and
//! nested tables in headers and expect them back unchanged). MQTT 5 user properties are
//! `Value::Str`.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::message::HeaderError;

/// One header value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Boolean (AMQP boolean; `true`/`false` as MQTT text).
    Bool(bool),
    /// Signed 8-bit integer (AMQP short-short-int).
    Int8(i8),
    /// Unsigned 8-bit integer.
    UInt8(u8),
    /// Signed 16-bit integer.
    Int16(i16),
    /// Unsigned 16-bit integer.
    UInt16(u16),
    /// Signed 32-bit integer (AMQP long-int; Java's `Integer`).
    Int32(i32),
    /// Unsigned 32-bit integer.
    UInt32(u32),
    /// Signed 64-bit integer (AMQP long-long-int).
    Int(i64),
    /// Unsigned integer that does not fit `i64` (AMQP unsigned long-long is rare).
    UInt(u64),
    /// 32-bit float.
    Float(f32),
    /// 64-bit float.
    Double(f64),
    /// Decimal: scale and unscaled value.
    Decimal(u8, u32),
    /// Text (AMQP short/long string that is valid UTF-8; MQTT user property values).
    Str(String),
    /// Bytes (AMQP byte array, or a long string that is not UTF-8).
    Bytes(Bytes),
    /// Timestamp, seconds since the epoch.
    Timestamp(u64),
    /// Field array: values of mixed types, in order (`[a,b]` as MQTT text).
    Array(Vec<Value>),
    /// Nested field table: name/value pairs in order (`{k=v}` as MQTT text).
    Table(Vec<(String, Value)>),
    /// No value (AMQP void).
    Void,
}

impl Value {
    /// The value as text, the way it is shown to an MQTT client (user property value).
    pub fn to_text(&self) -> String {
        match self {
            Value::Bool(b) => b.to_string(),
            Value::Int8(i) => i.to_string(),
            Value::UInt8(i) => i.to_string(),
            Value::Int16(i) => i.to_string(),
            Value::UInt16(i) => i.to_string(),
            Value::Int32(i) => i.to_string(),
            Value::UInt32(i) => i.to_string(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Double(f) => f.to_string(),
            Value::Decimal(scale, v) => {
                let s = v.to_string();
                let scale = *scale as usize;
                if scale == 0 || scale >= s.len() {
                    format!("{}e-{scale}", s)
                } else {
                    format!("{}.{}", &s[..s.len() - scale], &s[s.len() - scale..])
                }
            }
            Value::Str(s) => s.clone(),
            Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            Value::Timestamp(t) => t.to_string(),
            Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(Value::to_text).collect();
                format!("[{}]", parts.join(","))
            }
            Value::Table(fields) => {
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={}", v.to_text())).collect();
                format!("{{{}}}", parts.join(","))
            }
            Value::Void => String::new(),
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an integer, if it is one (or a string holding one).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int8(i) => Some(*i as i64),
            Value::UInt8(i) => Some(*i as i64),
            Value::Int16(i) => Some(*i as i64),
            Value::UInt16(i) => Some(*i as i64),
            Value::Int32(i) => Some(*i as i64),
            Value::UInt32(i) => Some(*i as i64),
            Value::Int(i) => Some(*i),
            Value::UInt(u) => i64::try_from(*u).ok(),
            Value::Timestamp(t) => i64::try_from(*t).ok(),
            Value::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub(crate) fn encode(&self, b: &mut BytesMut) {
        match self {
            Value::Bool(v) => {
                b.put_u8(b't');
                b.put_u8(*v as u8);
            }
            Value::Int8(v) => {
                b.put_u8(b'b');
                b.put_i8(*v);
            }
            Value::UInt8(v) => {
                b.put_u8(b'B');
                b.put_u8(*v);
            }
            Value::Int16(v) => {
                b.put_u8(b's');
                b.put_i16(*v);
            }
            Value::UInt16(v) => {
                b.put_u8(b'u');
                b.put_u16(*v);
            }
            Value::Int32(v) => {
                b.put_u8(b'I');
                b.put_i32(*v);
            }
            Value::UInt32(v) => {
                b.put_u8(b'i');
                b.put_u32(*v);
            }
            Value::Int(v) => {
                b.put_u8(b'l');
                b.put_i64(*v);
            }
            Value::UInt(v) => {
                b.put_u8(b'L');
                b.put_u64(*v);
            }
            Value::Float(v) => {
                b.put_u8(b'f');
                b.put_f32(*v);
            }
            Value::Double(v) => {
                b.put_u8(b'd');
                b.put_f64(*v);
            }
            Value::Decimal(s, v) => {
                b.put_u8(b'D');
                b.put_u8(*s);
                b.put_u32(*v);
            }
            Value::Str(v) => {
                b.put_u8(b'S');
                put_len_bytes(b, v.as_bytes());
            }
            Value::Bytes(v) => {
                b.put_u8(b'x');
                put_len_bytes(b, v);
            }
            Value::Timestamp(v) => {
                b.put_u8(b'T');
                b.put_u64(*v);
            }
            Value::Array(items) => {
                b.put_u8(b'A');
                b.put_u32(items.len() as u32);
                for i in items {
                    i.encode(b);
                }
            }
            Value::Table(fields) => {
                b.put_u8(b'F');
                encode_table(fields, b);
            }
            Value::Void => b.put_u8(b'V'),
        }
    }

    pub(crate) fn decode(b: &mut Bytes, depth: usize) -> Result<Value, HeaderError> {
        if depth > 64 {
            return Err(HeaderError);
        }
        let tag = take_u8(b)?;
        Ok(match tag {
            b't' => Value::Bool(take_u8(b)? != 0),
            b'b' => Value::Int8(take::<1>(b)?.get_i8()),
            b'B' => Value::UInt8(take_u8(b)?),
            b's' => Value::Int16(take::<2>(b)?.get_i16()),
            b'u' => Value::UInt16(take::<2>(b)?.get_u16()),
            b'I' => Value::Int32(take::<4>(b)?.get_i32()),
            b'i' => Value::UInt32(take::<4>(b)?.get_u32()),
            b'l' => Value::Int(take::<8>(b)?.get_i64()),
            b'L' => Value::UInt(take::<8>(b)?.get_u64()),
            b'f' => Value::Float(take::<4>(b)?.get_f32()),
            b'd' => Value::Double(take::<8>(b)?.get_f64()),
            b'D' => {
                let s = take_u8(b)?;
                Value::Decimal(s, take::<4>(b)?.get_u32())
            }
            b'S' => Value::Str(String::from_utf8(take_len_bytes(b)?.to_vec()).map_err(|_| HeaderError)?),
            b'x' => Value::Bytes(take_len_bytes(b)?),
            b'T' => Value::Timestamp(take::<8>(b)?.get_u64()),
            b'A' => {
                let n = take::<4>(b)?.get_u32() as usize;
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(Value::decode(b, depth + 1)?);
                }
                Value::Array(items)
            }
            b'F' => Value::Table(decode_table(b, depth + 1)?),
            b'V' => Value::Void,
            _ => return Err(HeaderError),
        })
    }
}

/// Encodes a table (count, then name/value pairs).
pub(crate) fn encode_table(fields: &[(String, Value)], b: &mut BytesMut) {
    b.put_u32(fields.len() as u32);
    for (k, v) in fields {
        put_len_bytes(b, k.as_bytes());
        v.encode(b);
    }
}

/// Decodes a table written by [`encode_table`].
pub(crate) fn decode_table(b: &mut Bytes, depth: usize) -> Result<Vec<(String, Value)>, HeaderError> {
    let n = take::<4>(b)?.get_u32() as usize;
    let mut fields = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let k = String::from_utf8(take_len_bytes(b)?.to_vec()).map_err(|_| HeaderError)?;
        fields.push((k, Value::decode(b, depth)?));
    }
    Ok(fields)
}

fn put_len_bytes(b: &mut BytesMut, v: &[u8]) {
    b.put_u32(v.len() as u32);
    b.put_slice(v);
}

fn take_u8(b: &mut Bytes) -> Result<u8, HeaderError> {
    if b.remaining() < 1 {
        return Err(HeaderError);
    }
    Ok(b.get_u8())
}

fn take<const N: usize>(b: &mut Bytes) -> Result<Bytes, HeaderError> {
    if b.remaining() < N {
        return Err(HeaderError);
    }
    Ok(b.split_to(N))
}

fn take_len_bytes(b: &mut Bytes) -> Result<Bytes, HeaderError> {
    let n = take::<4>(b)?.get_u32() as usize;
    if b.remaining() < n {
        return Err(HeaderError);
    }
    Ok(b.split_to(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let table = vec![
            ("b".to_string(), Value::Bool(true)),
            ("i".to_string(), Value::Int(-5)),
            ("i8".to_string(), Value::Int8(-1)),
            ("u8".to_string(), Value::UInt8(200)),
            ("i16".to_string(), Value::Int16(-300)),
            ("u16".to_string(), Value::UInt16(60000)),
            ("i32".to_string(), Value::Int32(-70000)),
            ("u32".to_string(), Value::UInt32(4_000_000_000)),
            ("u".to_string(), Value::UInt(u64::MAX)),
            ("f".to_string(), Value::Float(1.5)),
            ("d".to_string(), Value::Double(-2.25)),
            ("dec".to_string(), Value::Decimal(2, 12345)),
            ("s".to_string(), Value::Str("héllo".into())),
            ("x".to_string(), Value::Bytes(Bytes::from_static(&[0, 255]))),
            ("t".to_string(), Value::Timestamp(1_700_000_000)),
            ("a".to_string(), Value::Array(vec![Value::Void, Value::Int(1), Value::Str("x".into())])),
            ("n".to_string(), Value::Table(vec![("k".into(), Value::Array(vec![]))])),
        ];
        let mut b = BytesMut::new();
        encode_table(&table, &mut b);
        let mut bytes = b.freeze();
        assert_eq!(decode_table(&mut bytes, 0).unwrap(), table);
        assert!(bytes.is_empty());
    }

    #[test]
    fn text_forms() {
        assert_eq!(Value::Decimal(2, 12345).to_text(), "123.45");
        assert_eq!(Value::Array(vec![Value::Int(1), Value::Bool(false)]).to_text(), "[1,false]");
        assert_eq!(Value::Int(7).as_i64(), Some(7));
        assert_eq!(Value::Str(" 42 ".into()).as_i64(), Some(42));
    }

    #[test]
    fn garbage_never_panics() {
        for n in 0..64u8 {
            let junk: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37).wrapping_add(n)).collect();
            let _ = decode_table(&mut Bytes::from(junk), 0);
        }
    }
}

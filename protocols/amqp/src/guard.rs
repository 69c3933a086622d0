//! Field-table nesting guard, run on a payload before `amq-protocol` parses it.
//!
//! `amq-protocol`'s field-table parser recurses once per nested table or array with no
//! limit: six bytes per level are enough to overflow a 2 MiB stack within one 128 KiB
//! frame (an abort, not a panic). Measured in a debug build (dependencies at opt-level 1)
//! it takes about 8 KiB of stack per level: a 2 MiB stack (a tokio worker's) overflows
//! at about 250 levels, 256 KiB at 30. This module walks the same bytes iteratively where the
//! tables sit (the methods that carry one, the `headers` property, the AMQPLAIN
//! response), checks that every value is well formed and that nesting stays within
//! [`MAX_DEPTH`], without allocating.

/// Deepest nesting of tables and arrays accepted (the outermost table is level 1).
/// Real headers nest 3-4 levels (`x-death`: table, array, table, array).
pub const MAX_DEPTH: usize = 24;

/// A value or nesting level the guard refused (the payload would not parse, or nests
/// deeper than [`MAX_DEPTH`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused;

/// Argument layout elements, up to the last field table.
#[derive(Clone, Copy)]
enum Field {
    Octet,
    Short,
    ShortStr,
    Table,
}

use Field::{Octet, Short, ShortStr, Table};

/// Arguments of the methods that carry a field table, up to the table (bit fields of
/// fewer than 9 bits are one octet).
fn layout(class_id: u16, method_id: u16) -> &'static [Field] {
    match (class_id, method_id) {
        (10, 10) => &[Octet, Octet, Table],                     // connection.start
        (10, 11) => &[Table],                                   // connection.start-ok
        (40, 10) => &[Short, ShortStr, ShortStr, Octet, Table], // exchange.declare
        (40, 30) | (40, 40) => &[Short, ShortStr, ShortStr, ShortStr, Octet, Table], // exchange.(un)bind
        (50, 10) => &[Short, ShortStr, Octet, Table],           // queue.declare
        (50, 20) => &[Short, ShortStr, ShortStr, ShortStr, Octet, Table], // queue.bind
        (50, 50) => &[Short, ShortStr, ShortStr, ShortStr, Table], // queue.unbind
        (60, 20) => &[Short, ShortStr, ShortStr, Octet, Table], // basic.consume
        _ => &[],
    }
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], Refused> {
    if b.len() < n {
        return Err(Refused);
    }
    let (head, tail) = b.split_at(n);
    *b = tail;
    Ok(head)
}

fn take_u8(b: &mut &[u8]) -> Result<u8, Refused> {
    let s = take(b, 1)?;
    s.first().copied().ok_or(Refused)
}

fn take_len(b: &mut &[u8]) -> Result<usize, Refused> {
    let s = take(b, 4)?;
    let arr: [u8; 4] = s.try_into().map_err(|_| Refused)?;
    usize::try_from(u32::from_be_bytes(arr)).map_err(|_| Refused)
}

fn skip_shortstr(b: &mut &[u8]) -> Result<(), Refused> {
    let n = take_u8(b)?;
    take(b, usize::from(n)).map(|_| ())
}

/// Checks the arguments of method `class_id.method_id` (the bytes after the two ids).
pub(crate) fn check_method(class_id: u16, method_id: u16, mut args: &[u8]) -> Result<(), Refused> {
    for field in layout(class_id, method_id) {
        match field {
            Octet => {
                take(&mut args, 1)?;
            }
            Short => {
                take(&mut args, 2)?;
            }
            ShortStr => skip_shortstr(&mut args)?,
            Table => {
                let n = take_len(&mut args)?;
                check_table_body(take(&mut args, n)?)?;
            }
        }
    }
    Ok(())
}

/// Checks basic properties (the content header after class, weight and body size): the
/// `headers` table, if present.
pub(crate) fn check_properties(mut props: &[u8]) -> Result<(), Refused> {
    let hi = take_u8(&mut props)?;
    let _lo = take_u8(&mut props)?;
    if hi & 0x20 == 0 {
        return Ok(());
    }
    if hi & 0x80 != 0 {
        skip_shortstr(&mut props)?;
    }
    if hi & 0x40 != 0 {
        skip_shortstr(&mut props)?;
    }
    let n = take_len(&mut props)?;
    check_table_body(take(&mut props, n)?)
}

/// What a container being walked holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Field table (`F`): a short-string key before each tagged value.
    Table,
    /// Field array (`A`): tagged values without keys.
    Array,
}

/// Checks the contents of a field table (without its length prefix), iteratively.
pub(crate) fn check_table_body(body: &[u8]) -> Result<(), Refused> {
    // One (kind, remaining bytes) per open container; bounded by MAX_DEPTH.
    let mut stack: [(Kind, &[u8]); MAX_DEPTH] = [(Kind::Table, body); MAX_DEPTH];
    let mut depth = 1usize;
    while depth > 0 {
        let Some((kind, rest)) = stack.get_mut(depth - 1) else {
            return Err(Refused);
        };
        if rest.is_empty() {
            depth -= 1;
            continue;
        }
        if *kind == Kind::Table {
            skip_shortstr(rest)?;
        }
        let tag = take_u8(rest)?;
        let fixed = match tag {
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'L' | b'l' | b'd' | b'T' => 8,
            b'D' => 5,
            b'V' => 0,
            b'S' | b'x' => take_len(rest)?,
            b'A' | b'F' => {
                let n = take_len(rest)?;
                let inner = take(rest, n)?;
                if depth >= MAX_DEPTH {
                    return Err(Refused);
                }
                let kind = if tag == b'A' { Kind::Array } else { Kind::Table };
                if let Some(slot) = stack.get_mut(depth) {
                    *slot = (kind, inner);
                }
                depth += 1;
                continue;
            }
            _ => return Err(Refused),
        };
        take(rest, fixed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table nesting `levels` tables: {"": {"": ... {}}}.
    pub(crate) fn nested(levels: usize) -> Vec<u8> {
        let mut body: Vec<u8> = Vec::new();
        for _ in 1..levels {
            let mut outer = vec![0u8, b'F'];
            outer.extend_from_slice(&(body.len() as u32).to_be_bytes());
            outer.extend_from_slice(&body);
            body = outer;
        }
        body
    }

    #[test]
    fn depth_limit() {
        assert_eq!(check_table_body(&nested(MAX_DEPTH)), Ok(()));
        assert_eq!(check_table_body(&nested(MAX_DEPTH + 1)), Err(Refused));
        assert_eq!(check_table_body(&nested(10_000)), Err(Refused));
    }

    #[test]
    fn values_and_truncation() {
        let ok = [1, b'a', b't', 1, 1, b'b', b'S', 0, 0, 0, 2, b'h', b'i', 1, b'c', b'A', 0, 0, 0, 2, b'V', b'V'];
        assert_eq!(check_table_body(&ok), Ok(()));
        for cut in 0..ok.len() {
            // Every strict prefix either ends on an entry boundary or is refused.
            let r = check_table_body(&ok[..cut]);
            if ![0, 4, 13].contains(&cut) {
                assert_eq!(r, Err(Refused), "cut {cut}");
            }
        }
        assert_eq!(check_table_body(&[1, b'a', b'?']), Err(Refused));
    }

    #[test]
    fn method_layouts() {
        // basic.consume: ticket, queue "q", tag "", flags, table {}.
        let args = [0, 0, 1, b'q', 0, 0, 0, 0, 0, 0];
        assert_eq!(check_method(60, 20, &args), Ok(()));
        assert_eq!(check_method(60, 20, &args[..9]), Err(Refused));
        assert_eq!(check_method(60, 40, &[]), Ok(()));
    }

    #[test]
    fn properties_headers() {
        let deep = nested(MAX_DEPTH + 1);
        let mut props = vec![0x20, 0];
        props.extend_from_slice(&(deep.len() as u32).to_be_bytes());
        props.extend_from_slice(&deep);
        assert_eq!(check_properties(&props), Err(Refused));
        assert_eq!(check_properties(&[0x80, 0, 1, b'x']), Ok(()));
    }
}

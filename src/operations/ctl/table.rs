//! Output for people: aligned tables, human sizes and rates.

use serde_json::Value;

/// How a column's value is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// As it is.
    Plain,
    /// A number with thousands separators, right-aligned.
    Count,
    /// Bytes as B, KiB, MiB, ... right-aligned.
    Bytes,
}

/// One column: its heading, the (dotted) field it shows, and how.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Heading.
    pub title: &'static str,
    /// Field path, e.g. `messages` or `queue.name`.
    pub field: &'static str,
    /// Format.
    pub format: Format,
}

/// A column shorthand.
pub const fn col(title: &'static str, field: &'static str, format: Format) -> Column {
    Column { title, field, format }
}

/// `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in binary units (`1.5 MiB`).
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

fn field<'a>(row: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(row, |v, k| v.get(k))
}

fn cell(row: &Value, c: &Column) -> String {
    let Some(v) = field(row, c.field) else { return String::new() };
    match (c.format, v) {
        (Format::Count, Value::Number(n)) if n.is_u64() => count(n.as_u64().unwrap_or(0)),
        (Format::Bytes, Value::Number(n)) => bytes(n.as_u64().unwrap_or(0)),
        (_, Value::String(s)) => s.clone(),
        (_, Value::Null) => String::new(),
        (_, Value::Bool(b)) => if *b { "yes" } else { "no" }.into(),
        (_, Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned).unwrap_or_else(|| x.to_string()))
            .collect::<Vec<_>>()
            .join(", "),
        (_, other) => other.to_string(),
    }
}

/// The rows as an aligned table (numbers right-aligned), or `(none)`.
pub fn render(columns: &[Column], rows: &[Value]) -> String {
    if rows.is_empty() {
        return "(none)\n".into();
    }
    let cells: Vec<Vec<String>> = rows.iter().map(|r| columns.iter().map(|c| cell(r, c)).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|r| r[i].chars().count()).max().unwrap_or(0).max(c.title.len()))
        .collect();
    let right = |c: &Column| matches!(c.format, Format::Count | Format::Bytes);
    let line = |values: Vec<String>| -> String {
        let parts: Vec<String> = values
            .iter()
            .zip(columns)
            .zip(&widths)
            .map(|((v, c), w)| if right(c) { format!("{v:>w$}") } else { format!("{v:<w$}") })
            .collect();
        parts.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(columns.iter().map(|c| c.title.to_owned()).collect());
    for r in cells {
        out.push_str(&line(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_and_sizes_read_as_people_read_them() {
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        let cols = [col("name", "name", Format::Plain), col("messages", "messages", Format::Count)];
        let out = render(&cols, &[json!({"name": "a", "messages": 1200}), json!({"name": "longer", "messages": 3})]);
        assert_eq!(out, "name    messages\na          1,200\nlonger         3\n");
        assert_eq!(render(&cols, &[]), "(none)\n");
    }
}

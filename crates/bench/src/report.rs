//! Result rows, and the two ways they leave the program.
//!
//! A [`Row`] is an ordered list of `field = value`; every row has `bench`,
//! `system` and `threads`, then whatever figures the workload measured. The
//! [`Reporter`] either prints one JSON object per row on stdout as it
//! arrives (`--json`), or collects the rows of each `bench` into a table and
//! prints the tables, aligned, when a workload finishes. With `--out FILE`
//! the JSON lines also go to a file, whichever mode is on stdout.
//!
//! Everything else a workload wants to say (table captions, failed checks,
//! errors) goes to stderr in JSON mode, so stdout stays machine-readable.
//! Correctness failures are counted; [`Reporter::exit_code`] turns them into
//! the process's exit status.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use indicatif::ProgressBar;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

/// One result row: ordered `(field, value)` pairs.
#[derive(Clone, Debug, Default)]
pub struct Row {
    fields: Vec<(String, Value)>,
}

impl Row {
    /// A row with the three fields every row has.
    pub fn new(bench: &str, system: &str, threads: usize) -> Row {
        Row::default()
            .set("bench", bench)
            .set("system", system)
            .set("threads", threads)
    }

    /// Set (or replace) a field; keeps the first position of the field.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Row {
        // (`Value::from` a non-finite float is null: JSON has no NaN.)
        let value = value.into();
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((key.to_string(), value)),
        }
        self
    }

    /// Set a float field, rounded to `decimals` places so JSON stays readable.
    /// With `decimals <= 0` an integral value is written as a JSON integer.
    pub fn set_f(self, key: &str, value: f64, decimals: i32) -> Row {
        let p = 10f64.powi(decimals);
        let v = (value * p).round() / p;
        if decimals <= 0 && v.is_finite() && v.abs() < 9.0e15 {
            return self.set(key, v as i64);
        }
        self.set(key, v)
    }

    /// `key` = the median, `key_min` and `key_max` = the spread.
    pub fn set_spread(self, key: &str, s: &crate::util::Spread, decimals: i32) -> Row {
        self.set_f(key, s.median, decimals)
            .set_f(&format!("{key}_min"), s.min, decimals)
            .set_f(&format!("{key}_max"), s.max, decimals)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn bench(&self) -> &str {
        self.get("bench").and_then(Value::as_str).unwrap_or("?")
    }
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Rows of one `bench`, waiting to be printed as a table.
struct Table {
    bench: String,
    notes: Vec<String>,
    rows: Vec<Row>,
}

/// Where rows go.
pub struct Reporter {
    json: bool,
    out: Option<BufWriter<File>>,
    tables: Vec<Table>,
    progress: ProgressBar,
    failures: Vec<String>,
    errors: Vec<String>,
}

impl Reporter {
    /// `json`: JSON lines on stdout instead of tables. `out`: also write
    /// JSON lines to this file (truncated).
    pub fn new(json: bool, out: Option<&Path>) -> io::Result<Reporter> {
        let out = match out {
            Some(p) => Some(BufWriter::new(File::create(p).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot create {}: {e}", p.display()))
            })?)),
            None => None,
        };
        Ok(Reporter {
            json,
            out,
            tables: Vec::new(),
            progress: ProgressBar::hidden(),
            failures: Vec::new(),
            errors: Vec::new(),
        })
    }

    /// A progress bar on stderr for a workload of `total` steps; output is
    /// printed "around" it so the two do not garble. The caller advances it.
    pub fn start_progress(&mut self, total: u64, prefix: &str) -> ProgressBar {
        self.progress = crate::util::progress_bar(total, prefix);
        self.progress.clone()
    }

    /// Take the progress bar down.
    pub fn end_progress(&mut self) {
        self.progress.finish_and_clear();
        self.progress = ProgressBar::hidden();
    }

    /// The workload is done: print the tables, flush the file, and take
    /// the progress bar down.
    pub fn finish(&mut self) -> io::Result<()> {
        self.flush()?;
        self.end_progress();
        Ok(())
    }

    fn table(&mut self, bench: &str) -> &mut Table {
        if let Some(i) = self.tables.iter().position(|t| t.bench == bench) {
            return &mut self.tables[i];
        }
        self.tables.push(Table {
            bench: bench.to_string(),
            notes: Vec::new(),
            rows: Vec::new(),
        });
        self.tables.last_mut().expect("just pushed")
    }

    /// A caption line for `bench`'s table (stderr in JSON mode).
    pub fn note(&mut self, bench: &str, text: &str) {
        if self.json {
            let line = format!("# {bench}: {text}");
            self.progress.suspend(|| eprintln!("{line}"));
        } else {
            let t = self.table(bench);
            if !t.notes.iter().any(|n| n == text) {
                t.notes.push(text.to_string());
            }
        }
    }

    /// Record a result row.
    pub fn emit(&mut self, row: Row) -> io::Result<()> {
        let line = serde_json::to_string(&row).map_err(io::Error::other)?;
        if let Some(f) = &mut self.out {
            writeln!(f, "{line}")?;
        }
        if self.json {
            self.progress.suspend(|| -> io::Result<()> {
                let mut so = io::stdout().lock();
                writeln!(so, "{line}")?;
                so.flush()
            })?;
        } else {
            let bench = row.bench().to_string();
            self.table(&bench).rows.push(row);
        }
        Ok(())
    }

    /// A correctness check failed: say so now, and fail the exit status.
    pub fn fail(&mut self, msg: String) {
        let line = format!("memlab: CHECK FAILED: {msg}");
        self.progress.suspend(|| eprintln!("{line}"));
        self.failures.push(msg);
    }

    /// A run could not complete (allocator error, worker panic): say so
    /// now, and fail the exit status.
    pub fn error(&mut self, msg: String) {
        let line = format!("memlab: ERROR: {msg}");
        self.progress.suspend(|| eprintln!("{line}"));
        self.errors.push(msg);
    }

    /// Print (table mode) and forget the collected tables; flush the file.
    pub fn flush(&mut self) -> io::Result<()> {
        if let Some(f) = &mut self.out {
            f.flush()?;
        }
        let tables = std::mem::take(&mut self.tables);
        if self.json {
            return Ok(());
        }
        let mut text = String::new();
        for t in &tables {
            text.push_str(&render_table(t));
        }
        self.progress.suspend(|| -> io::Result<()> {
            let mut so = io::stdout().lock();
            so.write_all(text.as_bytes())?;
            so.flush()
        })
    }

    /// 0 when every run completed and every check passed, else 1. Repeats
    /// the failures on stderr so they are not lost above long output.
    pub fn exit_code(&self) -> i32 {
        if self.failures.is_empty() && self.errors.is_empty() {
            return 0;
        }
        eprintln!(
            "memlab: {} check(s) failed, {} run(s) with errors:",
            self.failures.len(),
            self.errors.len()
        );
        for f in &self.failures {
            eprintln!("  check failed: {f}");
        }
        for e in &self.errors {
            eprintln!("  error: {e}");
        }
        1
    }
}

/// Human form of one cell.
fn cell(key: &str, v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Bool(b) => if *b { "yes" } else { "NO" }.into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if key.contains("ops_per_sec") {
                return si(n.as_f64().unwrap_or(f64::NAN));
            }
            if key.ends_with("_bytes") {
                if let Some(b) = n.as_u64() {
                    return format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
                }
            }
            if let Some(i) = n.as_i64() {
                return i.to_string();
            }
            if let Some(u) = n.as_u64() {
                return u.to_string();
            }
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.abs() >= 100.0 {
                format!("{f:.0}")
            } else if f.abs() >= 1.0 {
                format!("{f:.2}")
            } else {
                format!("{f:.3}")
            }
        }
        other => other.to_string(),
    }
}

/// `12345678.0` → `12.35M`.
pub fn si(x: f64) -> String {
    let a = x.abs();
    if !x.is_finite() {
        "-".into()
    } else if a >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Width at which table captions wrap.
const NOTE_WIDTH: usize = 100;

/// A table column: one field, or a field with its `_min` and `_max`
/// shown as `value [min, max]`.
struct Col {
    header: String,
    keys: Vec<String>,
}

fn render_cell(r: &Row, col: &Col) -> Option<(String, bool)> {
    let v = r.get(&col.keys[0])?;
    let mut text = cell(&col.keys[0], v);
    if col.keys.len() == 3 {
        let lo = r
            .get(&col.keys[1])
            .map_or("-".into(), |x| cell(&col.keys[0], x));
        let hi = r
            .get(&col.keys[2])
            .map_or("-".into(), |x| cell(&col.keys[0], x));
        text = format!("{text} [{lo}, {hi}]");
    }
    Some((text, matches!(v, Value::Number(_))))
}

fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(indent);
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(indent);
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn render_table(t: &Table) -> String {
    // Fields in order of first appearance, minus `bench` (it is the title).
    let mut keys: Vec<&str> = Vec::new();
    for r in &t.rows {
        for (k, _) in &r.fields {
            if k != "bench" && !keys.contains(&k.as_str()) {
                keys.push(k);
            }
        }
    }
    let mut cols: Vec<Col> = Vec::new();
    for &k in &keys {
        let base = k.strip_suffix("_min").or_else(|| k.strip_suffix("_max"));
        if base.is_some_and(|b| keys.contains(&b)) {
            continue; // shown with its base field
        }
        let (lo, hi) = (format!("{k}_min"), format!("{k}_max"));
        if keys.contains(&lo.as_str()) && keys.contains(&hi.as_str()) {
            cols.push(Col {
                header: format!("{k} [min, max]"),
                keys: vec![k.to_string(), lo, hi],
            });
        } else {
            cols.push(Col {
                header: k.to_string(),
                keys: vec![k.to_string()],
            });
        }
    }
    // Columns with one value in every row become a caption line.
    let mut same = Vec::new();
    if t.rows.len() > 1 {
        cols.retain(|c| {
            let first = t.rows[0]
                .get(&c.keys[0])
                .and_then(|_| render_cell(&t.rows[0], c));
            let constant = c.keys[0] != "system"
                && first.is_some()
                && t.rows.iter().all(|r| render_cell(r, c) == first);
            if constant {
                same.push(format!(
                    "{}={}",
                    c.header,
                    first.map(|f| f.0).unwrap_or_default()
                ));
            }
            !constant
        });
    }
    let cells: Vec<Vec<(String, bool)>> = t
        .rows
        .iter()
        .map(|r| {
            cols.iter()
                .map(|c| render_cell(r, c).unwrap_or_default())
                .collect()
        })
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].0.chars().count())
                .chain([c.header.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = format!("\n== {} ==\n", t.bench);
    for n in &t.notes {
        s.push_str(&wrap(n, NOTE_WIDTH, "   "));
    }
    if t.rows.is_empty() {
        s.push_str("   (no results)\n");
        return s;
    }
    if !same.is_empty() {
        s.push_str(&wrap(
            &format!("Same in every row: {}.", same.join(", ")),
            NOTE_WIDTH,
            "   ",
        ));
    }
    let header: Vec<String> = cols
        .iter()
        .zip(&widths)
        .map(|(c, w)| format!("{:>w$}", c.header))
        .collect();
    s.push_str(&header.join("  "));
    s.push('\n');
    s.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len().saturating_sub(1))));
    s.push('\n');
    for r in &cells {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|((text, numeric), w)| {
                if *numeric {
                    format!("{text:>w$}")
                } else {
                    format!("{text:<w$}")
                }
            })
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// The correctness counters of a run on a key-value store, summed over
/// its threads.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// Reads that found no value (must be 0).
    pub misses: u64,
    /// Reads that returned a wrong value (must be 0).
    pub bad_values: u64,
    /// Writes that failed (out of memory).
    pub put_errors: u64,
    pub first_error: Option<String>,
}

impl Checks {
    /// A write failed: count it, and keep the first one's message.
    pub fn put_failed(&mut self, msg: impl FnOnce() -> String) {
        self.put_errors += 1;
        self.first_error.get_or_insert_with(msg);
    }

    /// Add another thread's (or phase's) counters; the first error stays
    /// the first.
    pub fn add(&mut self, o: Checks) {
        self.misses += o.misses;
        self.bad_values += o.bad_values;
        self.put_errors += o.put_errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    /// Report them: a read that missed or returned a wrong value fails the
    /// run (exit status 1); failed writes are errors. `missed` names what
    /// was read ("reads of loaded keys").
    pub fn report(&self, rep: &mut Reporter, what: &str, missed: &str) {
        let Checks {
            misses,
            bad_values,
            put_errors,
            first_error,
        } = self;
        if *misses > 0 || *bad_values > 0 {
            rep.fail(format!(
                "{what}: {misses} {missed} missed, {bad_values} returned a wrong value"
            ));
        }
        if *put_errors > 0 {
            rep.error(format!(
                "{what}: {put_errors} writes failed, first: {}",
                first_error.as_deref().unwrap_or("?")
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_serializes_in_order() {
        let r = Row::new("b", "s", 2).set("z", 1).set("a", true).set("z", 3);
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"bench":"b","system":"s","threads":2,"z":3,"a":true}"#
        );
    }

    #[test]
    fn table_aligns() {
        let t = Table {
            bench: "x".into(),
            notes: vec!["note".into()],
            rows: vec![
                Row::new("x", "distributed", 1).set("ops_per_sec", 12_345_678.0),
                Row::new("x", "gl", 16).set("ops_per_sec", 1.0),
            ],
        };
        let s = render_table(&t);
        assert!(s.contains("12.35M"), "{s}");
        let lines: Vec<&str> = s.lines().filter(|l| l.contains("distributed")).collect();
        assert_eq!(lines.len(), 1);
    }
}

//! nccl-tests' results table, column for column: size, count, type, redop, root, then time,
//! algbw, busbw and #wrong for out-of-place and for in-place, and the footer with the
//! out-of-bounds count and the average bus bandwidth.

use std::fmt::Write;

use super::report::Measure;

/// The three header lines.
pub(crate) fn header() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = write!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    s
}

/// One result line; `note` goes at the end (e.g. the world size after a shrink).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row(
    size: u64,
    count: u64,
    dtype: &str,
    redop: &str,
    root: i64,
    out_of_place: Option<&Measure>,
    in_place: Option<&Measure>,
    note: &str,
) -> String {
    let mut s = format!("{size:>12}  {count:>12}  {dtype:>8}  {redop:>6}  {root:>6}");
    for m in [out_of_place, in_place] {
        match m {
            Some(m) => {
                let wrong = m.wrong.map_or_else(|| "N/A".to_owned(), |w| w.to_string());
                let _ = write!(
                    s,
                    "  {:>7}  {:>6}  {:>6}  {:>6}",
                    number(m.time_us, 7),
                    number(m.algbw_gbs, 6),
                    number(m.busbw_gbs, 6),
                    wrong
                );
            }
            None => {
                let _ = write!(
                    s,
                    "  {:>7}  {:>6}  {:>6}  {:>6}",
                    "N/A", "N/A", "N/A", "N/A"
                );
            }
        }
    }
    if !note.is_empty() {
        let _ = write!(s, "  {note}");
    }
    s
}

/// The footer.
pub(crate) fn footer(wrong: u64, avg_busbw: f64) -> String {
    format!(
        "# {:<20} : {} {}\n# {:<20} : {} \n#",
        "Out of bounds values",
        wrong,
        if wrong > 0 { "FAILED" } else { "OK" },
        "Avg bus bandwidth",
        general(avg_busbw)
    )
}

/// `value` in at most `width` characters, as nccl-tests prints it: two decimals, else one,
/// else none, else exponent notation.
pub(crate) fn number(value: f64, width: usize) -> String {
    for decimals in [2, 1, 0] {
        let s = format!("{value:.decimals$}");
        if s.len() <= width {
            return s;
        }
    }
    format!("{value:.1e}")
}

/// `%g`: six significant digits, trailing zeros dropped.
pub(crate) fn general(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs().log10().floor() as i32;
    if !(-5..6).contains(&magnitude) {
        return format!("{value:.5e}");
    }
    let decimals = (5 - magnitude).max(0) as usize;
    let s = format!("{value:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_line_up_with_the_header() {
        let m = Measure {
            time_us: 28.49,
            algbw_gbs: 0.0003,
            busbw_gbs: 0.0004,
            wrong: Some(0),
        };
        let line = row(8, 2, "float", "sum", -1, Some(&m), None, "");
        assert_eq!(
            line,
            "           8             2     float     sum      -1    28.49    0.00    0.00       0      N/A     N/A     N/A     N/A"
        );
        let head = header();
        let columns = head.lines().nth(2).unwrap();
        assert_eq!(columns.len(), line.len(), "header:\n{head}\nrow:\n{line}");
    }

    #[test]
    fn numbers_fit_their_columns() {
        assert_eq!(number(28.4912, 7), "28.49");
        assert_eq!(number(123456.7, 7), "123457");
        assert_eq!(number(9_999_999.0, 6), "1.0e7");
        assert_eq!(general(1.96), "1.96");
        assert_eq!(general(0.5333333), "0.533333");
        assert_eq!(general(0.0), "0");
        assert!(footer(0, 1.5).contains("Out of bounds values : 0 OK"));
        assert!(footer(3, 1.5).contains("3 FAILED"));
    }
}

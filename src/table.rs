//! Plain column-aligned tables for the CLI listings (`images ls`, `pods ls`).

/// Left-aligned columns separated by three spaces, trailing blanks trimmed.
pub fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligns_columns() {
        let rows = [["A".to_string(), "BB".into()], ["CCC".into(), "D".into()]];
        assert_eq!(super::render(&rows), "A     BB\nCCC   D\n");
    }
}

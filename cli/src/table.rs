//! kubectl's plain output: columns padded to the widest cell, three spaces apart, no trailing
//! blanks.

use std::io::Write;

/// Rows of text cells under a header.
#[derive(Debug, Clone, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with this header row.
    pub fn new(header: &[&str]) -> Self {
        Self { rows: vec![header.iter().map(|h| (*h).to_owned()).collect()] }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes the rows with aligned columns.
    ///
    /// # Errors
    /// When `out` fails.
    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 3));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

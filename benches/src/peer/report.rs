//! Writes a run's report files: `report.md`, `report.json` and `busbw.png`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::peer::record::RawDir;
use crate::peer::summary::{Summary, summarize};
use crate::peer::{PeerError, markdown, plot};

/// The files written, and the plot's failure if only the plot failed (the table and JSON
/// are still worth having when, say, no font is installed).
#[derive(Debug)]
pub struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub plot: Result<PathBuf, PeerError>,
    pub summary: Summary,
}

/// Reads `raw` and writes the report into `out`.
pub fn write(raw: &RawDir, out: &Path) -> Result<Written, PeerError> {
    let (meta, records) = raw.read()?;
    let summary = summarize(meta, &records);
    fs::create_dir_all(out).map_err(|e| PeerError::io(format!("create {}", out.display()), e))?;
    let md_path = out.join("report.md");
    fs::write(&md_path, markdown::render(&summary))
        .map_err(|e| PeerError::io(format!("write {}", md_path.display()), e))?;
    let json_path = out.join("report.json");
    let json = serde_json::to_string_pretty(&summary).map_err(|e| PeerError::BadResults {
        path: json_path.display().to_string(),
        why: e.to_string(),
    })?;
    fs::write(&json_path, json)
        .map_err(|e| PeerError::io(format!("write {}", json_path.display()), e))?;
    let png_path = out.join("busbw.png");
    let plot = plot::draw(&summary, &png_path).map(|()| png_path);
    Ok(Written {
        markdown: md_path,
        json: json_path,
        plot,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::record::tests::{meta, temp_dir};
    use crate::peer::summary::tests::records;

    #[test]
    fn a_raw_run_becomes_three_files_and_the_json_reads_back() {
        let dir = temp_dir("report");
        let raw = RawDir::new(dir.join("raw"));
        raw.start(&meta()).unwrap();
        for r in records() {
            raw.append(&r).unwrap();
        }
        let written = write(&raw, &dir).unwrap();
        assert!(
            fs::read_to_string(&written.markdown)
                .unwrap()
                .contains("## 4 ranks")
        );
        // serde_json may move a float's last bit, so compare what a reader sees.
        let back: Summary =
            serde_json::from_str(&fs::read_to_string(&written.json).unwrap()).unwrap();
        assert_eq!(markdown::render(&back), markdown::render(&written.summary));
        assert!(written.plot.unwrap().is_file());
        let _ = fs::remove_dir_all(&dir);
    }
}

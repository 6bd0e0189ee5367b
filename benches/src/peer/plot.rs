//! The plot: bus bandwidth against size, one panel per rank count, one line per system,
//! with the machine's limits drawn dashed (memcpy per size, the loopback TCP stream flat).

use std::path::Path;

use plotters::prelude::*;

use crate::peer::PeerError;
use crate::peer::summary::{Limits, Summary, World};
use crate::peer::sweep::Bytes;
use crate::peer::system::System;

const PANEL: (u32, u32) = (820, 620);

/// Draws `busbw.png` (or any path) for every rank count in the summary.
pub fn draw(summary: &Summary, path: &Path) -> Result<(), PeerError> {
    let panels = u32::try_from(summary.worlds.len().max(1)).unwrap_or(1);
    let root = BitMapBackend::new(path, (PANEL.0 * panels, PANEL.1)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let areas = root.split_evenly((1, panels as usize));
    // One bandwidth axis for all panels, so that rank counts compare by eye.
    let y = summary
        .worlds
        .iter()
        .map(|w| extent(&series(w), &summary.limits))
        .fold(None, |acc, e| match (acc, e) {
            (None, e) => e,
            (Some(a), None) => Some(a),
            (Some(a), Some(b)) => Some(Extent {
                x: (a.x.0.min(b.x.0), a.x.1.max(b.x.1)),
                y: (a.y.0.min(b.y.0), a.y.1.max(b.y.1)),
            }),
        });
    for (area, world) in areas.iter().zip(&summary.worlds) {
        draw_world(area, summary, world, y)?;
    }
    root.present().map_err(plot_error)
}

fn color(system: System) -> RGBColor {
    match system {
        System::ChorusTcp => RGBColor(214, 39, 40),
        System::ChorusShm => RGBColor(140, 86, 75),
        System::ChorusPy => RGBColor(255, 127, 14),
        System::ChorusTorch => RGBColor(148, 103, 189),
        System::GlooTcp => RGBColor(31, 119, 180),
        System::OpenMpiTcp => RGBColor(44, 160, 44),
        System::OpenMpiShm => RGBColor(148, 103, 189),
    }
}

/// The ranges a panel's axes must cover: sizes and bandwidths, before padding.
#[derive(Clone, Copy, Debug)]
struct Extent {
    x: (f64, f64),
    y: (f64, f64),
}

/// Each measured system's (size, busbw) points at one rank count, right results only.
fn series(w: &World) -> Vec<(System, Vec<(f64, f64)>)> {
    System::ALL
        .iter()
        .map(|&system| {
            let points = w
                .rows
                .iter()
                .filter_map(|row| {
                    let st = row
                        .cells
                        .iter()
                        .flatten()
                        .find(|c| c.system == system)?
                        .in_place
                        .as_ref()?;
                    (st.wrong == 0 && st.busbw_gbs > 0.0)
                        .then_some((row.size.0 as f64, st.busbw_gbs))
                })
                .collect();
            (system, points)
        })
        .filter(|(_, points): &(System, Vec<(f64, f64)>)| !points.is_empty())
        .collect()
}

fn memcpy_points(limits: &Limits) -> Vec<(f64, f64)> {
    limits
        .memcpy
        .iter()
        .filter(|p| p.gbs > 0.0)
        .map(|p| (p.size.0 as f64, p.gbs))
        .collect()
}

fn tcp_rate(limits: &Limits) -> Option<f64> {
    limits.tcp.map(|t| t.stream_gbs).filter(|g| *g > 0.0)
}

fn extent(series: &[(System, Vec<(f64, f64)>)], limits: &Limits) -> Option<Extent> {
    let points: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .chain(memcpy_points(limits))
        .collect();
    let x = points.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let y = points
        .iter()
        .map(|p| p.1)
        .chain(tcp_rate(limits))
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    (x.0.is_finite() && y.0.is_finite()).then_some(Extent { x, y })
}

fn draw_world(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    s: &Summary,
    w: &World,
    shared: Option<Extent>,
) -> Result<(), PeerError> {
    let series = series(w);
    let memcpy = memcpy_points(&s.limits);
    let tcp = tcp_rate(&s.limits);
    let (x_lo, x_hi, y_lo, y_hi) = match shared {
        Some(e) => (e.x.0, e.x.1.max(e.x.0 * 2.0), e.y.0 / 2.0, e.y.1 * 2.0),
        None => (8.0, (128u64 << 20) as f64, 1e-4, 100.0),
    };

    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("all-reduce float32 sum, {} ranks", w.ranks),
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((x_lo..x_hi).log_scale().base(2.0), (y_lo..y_hi).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("size per rank")
        .y_desc("bus bandwidth, GB/s (in-place)")
        .x_labels(10)
        .x_label_formatter(&|x| Bytes(x.round() as u64).to_string())
        .y_label_formatter(&|y| gbs_label(*y))
        .draw()
        .map_err(plot_error)?;

    for (system, points) in &series {
        let c = color(*system);
        chart
            .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
            .map_err(plot_error)?
            .label(system.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(plot_error)?;
    }
    if !memcpy.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(
                memcpy.iter().copied(),
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label("memcpy, 1 thread (limit)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(1)));
    }
    if let Some(gbs) = tcp {
        let grey = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                [(x_lo, gbs), (x_hi, gbs)],
                6,
                4,
                grey.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label("TCP loopback stream, 1 conn (limit)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], grey.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

/// A bandwidth tick: `100`, `1`, `0.01`, `0.00001`, without float noise.
fn gbs_label(y: f64) -> String {
    if y >= 1.0 {
        return format!("{y:.0}");
    }
    let decimals = (-y.log10()).ceil().clamp(0.0, 12.0) as usize;
    format!("{y:.decimals$}")
}

fn plot_error(e: impl std::fmt::Display) -> PeerError {
    PeerError::Plot(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::record::tests::{meta, temp_dir};
    use crate::peer::summary::summarize;
    use crate::peer::summary::tests::records;

    #[test]
    fn the_plot_is_a_png_with_one_panel_per_rank_count() {
        let dir = temp_dir("plot");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("busbw.png");
        draw(&summarize(meta(), &records()), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, right after the 8-byte signature and 8-byte chunk head.
        let width = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
        assert_eq!(width, PANEL.0 * 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bandwidth_ticks_read_as_plain_numbers() {
        assert_eq!(gbs_label(100.0), "100");
        assert_eq!(gbs_label(0.01), "0.01");
        assert_eq!(gbs_label(9.999999999999999e-6), "0.00001");
        assert_eq!(gbs_label(0.001), "0.001");
    }
}

//! Grouped bar charts as SVG strings: one group per variant, one bar per series, each bar a mean with a
//! whisker over its repeats' range.

use plotters::prelude::*;

use super::output::Spread;

pub struct Bars<'a> {
    pub title: &'a str,
    pub y_desc: &'a str,
    pub categories: &'a [String],
    /// Each series' name and one spread per category.
    pub series: &'a [(String, Vec<Spread>)],
}

fn plot_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub fn grouped_bars(bars: &Bars<'_>) -> Result<String, String> {
    let n = bars.categories.len().max(1);
    let k = bars.series.len().max(1);
    let top = bars
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|s| s.max))
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let width = (160 * n as u32 + 120).max(560);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(bars.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(plot_err)?;
        let names = bars.categories;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(bars.y_desc)
            .draw()
            .map_err(plot_err)?;
        let group = 0.8;
        let w = group / k as f64;
        for (j, (name, values)) in bars.series.iter().enumerate() {
            let color = Palette99::pick(j).to_rgba();
            let x_of = |i: usize| i as f64 - group / 2.0 + w * j as f64;
            chart
                .draw_series(values.iter().enumerate().map(|(i, s)| {
                    let x0 = x_of(i);
                    Rectangle::new(
                        [(x0 + w * 0.05, 0.0), (x0 + w * 0.95, s.mean)],
                        color.filled(),
                    )
                }))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
            chart
                .draw_series(values.iter().enumerate().map(|(i, s)| {
                    let xc = x_of(i) + w / 2.0;
                    PathElement::new(vec![(xc, s.min), (xc, s.max)], BLACK.stroke_width(2))
                }))
                .map_err(plot_err)?;
        }
        if bars.series.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

package bench

import (
	"errors"
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The systems' colours in every chart.
var colours = map[System]color.Color{
	Tenure: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	Etcd:   color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// throughputBars are the figures the throughput chart shows: one bar
// per system for each.
var throughputBars = []struct {
	workload int
	variant  string
	figure   string
	label    string
}{
	{1, "", "pairs/s", "(1) one client\npairs/s"},
	{2, "", "pairs/s", "(2) 64 own locks\npairs/s"},
	{3, "", "handoffs/s", "(3) contended\nhandoffs/s"},
	{7, "", "CAS/s", "(7) 64 CAS\nCAS/s"},
	{10, "1: one client", "pairs/s", "(10) 3 nodes\n(1) pairs/s"},
	{10, "2: 64 goroutines, own locks", "pairs/s", "(10) 3 nodes\n(2) pairs/s"},
	{10, "3: 16 contenders, one lock", "handoffs/s", "(10) 3 nodes\n(3) handoffs/s"},
}

// latencyCharts are the latency distributions drawn, one chart each.
var latencyCharts = []struct {
	workload int
	sample   string
	file     string
	title    string
}{
	{1, "pair", "latency-one-client.svg", "(1) one client: Lock+Unlock pair latency"},
	{3, "handoff", "latency-contended.svg", "(3) 16 contenders: Unlock called → next Lock returns"},
	{5, "resign→next", "latency-resign.svg", "(5) Resign called → next Campaign returns"},
}

// WriteCharts draws the report's charts as SVG files into dir (made if
// need be) and returns their paths: throughput bars per workload, the
// latency distributions of workloads 1, 3 and 5, workload 9's scaling,
// and workload 13's growth (growth-<dimension>-latency, -throughput and
// -rss.svg). A chart whose workload did not run is left out.
func (r *Report) WriteCharts(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	var errs []error
	save := func(p *plot.Plot, w vg.Length, name string) {
		path := filepath.Join(dir, name)
		if err := p.Save(w, 4*vg.Inch, path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			return
		}
		files = append(files, path)
	}
	if p, ok := r.throughputChart(); ok {
		save(p, 9*vg.Inch, "throughput.svg")
	}
	for _, lc := range latencyCharts {
		if p, ok := r.latencyChart(lc.workload, lc.sample, lc.title); ok {
			save(p, 6*vg.Inch, lc.file)
		}
	}
	if p, ok := r.scalingChart(); ok {
		save(p, 6*vg.Inch, "scaling.svg")
	}
	growth := r.growthCharts()
	for _, name := range slices.Sorted(maps.Keys(growth)) {
		save(growth[name], 7*vg.Inch, name)
	}
	return files, errors.Join(errs...)
}

// median is the median over the rounds of a figure, and whether any
// round measured it.
func (r *Report) median(s System, workload int, variant, figure string) (float64, bool) {
	var vs []float64
	for _, res := range r.Results {
		if res.System == s && res.Workload == workload && res.Variant == variant {
			if f, ok := res.figure(figure); ok {
				vs = append(vs, f.Value)
			}
		}
	}
	sp := spreadOf(vs)
	return sp.Median, sp.N > 0
}

func (r *Report) throughputChart() (*plot.Plot, bool) {
	var labels []string
	values := map[System]plotter.Values{}
	for _, b := range throughputBars {
		row := map[System]float64{}
		any := false
		for _, s := range r.Systems {
			v, ok := r.median(s, b.workload, b.variant, b.figure)
			row[s], any = v, any || ok
		}
		if !any {
			continue
		}
		labels = append(labels, b.label)
		for _, s := range r.Systems {
			values[s] = append(values[s], row[s])
		}
	}
	if len(labels) == 0 {
		return nil, false
	}
	p := plot.New()
	p.Title.Text = "Throughput, median of " + strconv.Itoa(r.Rounds) + " round(s): higher is better"
	p.Y.Label.Text = "operations per second"
	p.Y.Min = 0
	p.Y.Tick.Marker = wholeTicks{}
	width := vg.Points(18)
	for i, s := range r.Systems {
		bars, err := plotter.NewBarChart(values[s], width)
		if err != nil {
			return nil, false
		}
		bars.Color = colours[s]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(r.Systems)-1)/2)
		p.Add(bars)
		p.Legend.Add(systemLabel(s), bars)
	}
	p.Legend.Top = true
	p.NominalX(labels...)
	// Room at the sides for the outer labels, and above the bars for
	// the legend.
	p.X.Min, p.X.Max = -0.7, float64(len(labels))-0.3
	top := 0.0
	for _, vs := range values {
		for _, v := range vs {
			top = max(top, v)
		}
	}
	p.Y.Max = top * 1.15
	p.Add(plotter.NewGrid())
	return p, true
}

func (r *Report) latencyChart(workload int, sample, title string) (*plot.Plot, bool) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "milliseconds (log scale)"
	p.Y.Label.Text = "fraction of samples at or below"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	drawn := false
	for _, s := range r.Systems {
		var all []float64
		for _, res := range r.Results {
			if res.System == s && res.Workload == workload && res.Variant == "" {
				all = append(all, res.Samples[sample]...)
			}
		}
		pts := cdf(all, 400)
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, false
		}
		line.Color = colours[s]
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s (%s samples)", systemLabel(s), thousands(int64(len(all)))), line)
		drawn = true
	}
	if !drawn {
		return nil, false
	}
	p.Legend.Left, p.Legend.Top = false, false
	p.Add(plotter.NewGrid())
	return p, true
}

// cdf is the empirical distribution of samples (ms) as at most n points,
// leaving out samples that are not positive, which a log scale cannot
// show.
func cdf(samples []float64, n int) plotter.XYs {
	s := slices.DeleteFunc(slices.Clone(samples), func(v float64) bool { return v <= 0 })
	slices.Sort(s)
	if len(s) == 0 {
		return nil
	}
	step := max(1, len(s)/n)
	var pts plotter.XYs
	for i := 0; i < len(s); i += step {
		pts = append(pts, plotter.XY{X: s[i], Y: float64(i+1) / float64(len(s))})
	}
	if last := len(s) - 1; last%step != 0 {
		pts = append(pts, plotter.XY{X: s[last], Y: 1})
	}
	return pts
}

func (r *Report) scalingChart() (*plot.Plot, bool) {
	p := plot.New()
	p.Title.Text = "(9) goroutines on their own locks over up to 4 connections"
	p.X.Label.Text = "goroutines (log scale)"
	p.Y.Label.Text = "Lock+Unlock pairs per second (median)"
	p.X.Scale = plot.LogScale{}
	p.Y.Min = 0
	p.Y.Tick.Marker = wholeTicks{}
	var ticks plot.ConstantTicks
	drawn := false
	for _, s := range r.Systems {
		var pts plotter.XYs
		for _, res := range r.Results {
			if res.System != s || res.Workload != 9 || res.Round != 1 {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSuffix(res.Variant, " goroutines"))
			if err != nil {
				continue
			}
			if v, ok := r.median(s, 9, res.Variant, "pairs/s"); ok {
				pts = append(pts, plotter.XY{X: float64(n), Y: v})
				if s == Tenure {
					ticks = append(ticks, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
				}
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, false
		}
		line.Color, points.Color = colours[s], colours[s]
		line.Width = vg.Points(1.5)
		p.Add(line, points)
		p.Legend.Add(systemLabel(s), line, points)
		drawn = true
	}
	if !drawn {
		return nil, false
	}
	p.X.Tick.Marker = ticks
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p, true
}

// wholeTicks are gonum's default ticks labelled as whole numbers with
// thousands separators: rates, not "5000.00".
type wholeTicks struct{}

func (wholeTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = thousands(int64(ticks[i].Value))
		}
	}
	return ticks
}

func systemLabel(s System) string {
	if s == Etcd {
		return "etcd 3.4"
	}
	return "Tenure"
}

// growthDimensions are workload 13's dimensions as the charts name them:
// the variant's prefix, and the unit of the x axis.
var growthDimensions = []struct{ name, axis string }{
	{"keys", "live keys"},
	{"sessions", "idle sessions"},
	{"watchers", "idle watchers"},
	{"history", "retained revisions"},
}

// growthPoints are (size, figure) at each of workload 13's steps of dim
// that system s measured, by size.
func (r *Report) growthPoints(s System, dim, figure string) plotter.XYs {
	var pts plotter.XYs
	seen := map[string]bool{}
	for _, res := range r.Results {
		if res.System != s || res.Workload != 13 || !strings.HasPrefix(res.Variant, dim+" ") || seen[res.Variant] {
			continue
		}
		seen[res.Variant] = true
		size, ok1 := r.median(s, 13, res.Variant, "size")
		v, ok2 := r.median(s, 13, res.Variant, figure)
		if ok1 && ok2 && size > 0 {
			pts = append(pts, plotter.XY{X: size, Y: v})
		}
	}
	slices.SortFunc(pts, func(a, b plotter.XY) int {
		if a.X < b.X {
			return -1
		}
		if a.X > b.X {
			return 1
		}
		return 0
	})
	return pts
}

// growthCharts are workload 13's charts, three per dimension it ran:
// p50 latency and throughput of workloads 1 and 2, and server RSS,
// against the state's size.
func (r *Report) growthCharts() map[string]*plot.Plot {
	out := map[string]*plot.Plot{}
	for _, d := range growthDimensions {
		for _, c := range []struct {
			file, title, ylabel string
			figures             []string
		}{
			{"latency", "p50 latency of a Lock+Unlock pair (lower is better)", "milliseconds (log scale)", []string{"(1) pair p50", "(2) pair p50"}},
			{"throughput", "Lock+Unlock pairs per second (higher is better)", "pairs per second (log scale)", []string{"(1) pairs/s", "(2) pairs/s"}},
		} {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("(13) %s as %s grow", c.title, d.axis)
			p.X.Label.Text = d.axis + " (log scale)"
			p.Y.Label.Text = c.ylabel
			p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			drawn := false
			for _, s := range r.Systems {
				for k, fig := range c.figures {
					pts := slices.DeleteFunc(r.growthPoints(s, d.name, fig), func(p plotter.XY) bool { return p.Y <= 0 })
					if len(pts) == 0 {
						continue
					}
					line, points, err := plotter.NewLinePoints(pts)
					if err != nil {
						continue
					}
					line.Color, points.Color = colours[s], colours[s]
					line.Width = vg.Points(1.5)
					label := "(1) one client"
					if k == 1 {
						line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
						points.Shape = draw.BoxGlyph{}
						label = "(2) 64 goroutines"
					}
					p.Add(line, points)
					p.Legend.Add(systemLabel(s)+", "+label, line, points)
					drawn = true
				}
			}
			if drawn {
				p.Legend.Top, p.Legend.Left = true, true
				p.Add(plotter.NewGrid())
				out["growth-"+d.name+"-"+c.file+".svg"] = p
			}
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("(13) server RSS as %s grow (lower is better)", d.axis)
		p.X.Label.Text = d.axis
		p.Y.Label.Text = "MiB"
		p.X.Tick.Marker = wholeTicks{}
		p.Y.Tick.Marker = wholeTicks{}
		p.X.Min, p.Y.Min = 0, 0
		drawn := false
		for _, s := range r.Systems {
			pts := r.growthPoints(s, d.name, "server RSS")
			if len(pts) == 0 {
				continue
			}
			if v, ok := r.median(s, 13, d.name, "server RSS at start"); ok {
				pts = append(plotter.XYs{{X: 0, Y: v}}, pts...)
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				continue
			}
			line.Color, points.Color = colours[s], colours[s]
			line.Width = vg.Points(1.5)
			p.Add(line, points)
			label := systemLabel(s)
			for _, res := range r.Results {
				if res.System == s && res.Workload == 13 && res.Variant == d.name {
					for _, f := range res.Figures {
						if strings.HasPrefix(f.Name, "RSS per ") {
							label += fmt.Sprintf(" (slope %s B per %s)", thousands(int64(math.Round(f.Value))), strings.TrimSuffix(strings.TrimPrefix(f.Name, "RSS per "), " (slope)"))
						}
					}
				}
			}
			p.Legend.Add(label, line, points)
			drawn = true
		}
		if drawn {
			p.Legend.Top, p.Legend.Left = true, true
			p.Add(plotter.NewGrid())
			out["growth-"+d.name+"-rss.svg"] = p
		}
	}
	return out
}

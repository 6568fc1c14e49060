package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one set of samples in a plot.
type Series struct {
	Label  string
	Color  color.RGBA
	Dashed bool
	Xs     []float64 // milliseconds
}

// Plot draws the empirical CDF of each series on a log-scaled time axis: a step per
// sample, with a dot at each sample, so a handful of trials stays readable.
type Plot struct {
	Title, XLabel, YLabel string
	Width, Height         int
	Series                []Series
}

var (
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{215, 215, 215, 255}
	white = color.RGBA{255, 255, 255, 255}
)

// WritePNG renders p as a PNG.
func (p Plot) WritePNG(w io.Writer) error {
	return png.Encode(w, p.Render())
}

// Render draws p.
func (p Plot) Render() *image.RGBA {
	if p.Width == 0 {
		p.Width, p.Height = 1120, 560
	}
	img := image.NewRGBA(image.Rect(0, 0, p.Width, p.Height))
	draw.Draw(img, img.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)
	// The legend sits right of the axes, where no curve can run under it.
	left, right, top, bottom := 80, p.Width-250, 60, p.Height-70
	// x range: whole decades around the samples.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for _, x := range s.Xs {
			if x > 0 {
				lo, hi = min(lo, x), max(hi, x)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 1000
	}
	d0, d1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if d1 <= d0 {
		d1 = d0 + 1
	}
	px := func(x float64) int {
		x = max(x, math.Pow(10, d0))
		return left + int(math.Round((math.Log10(x)-d0)/(d1-d0)*float64(right-left)))
	}
	py := func(y float64) int { return bottom - int(math.Round(y*float64(bottom-top))) }

	// Grid, axes, ticks.
	for d := d0; d <= d1; d++ {
		x := px(math.Pow(10, d))
		vline(img, x, top, bottom, grey)
		label := msLabel(math.Pow(10, d))
		text(img, x-textWidth(label)/2, bottom+18, label, black)
		for k := 2.0; k < 10 && d < d1; k++ {
			xm := px(k * math.Pow(10, d))
			vline(img, xm, bottom-4, bottom, black)
		}
	}
	for _, y := range []float64{0, 0.25, 0.5, 0.75, 1} {
		hline(img, left, right, py(y), grey)
		label := fmt.Sprintf("%.2f", y)
		text(img, left-8-textWidth(label), py(y)+4, label, black)
	}
	hline(img, left, right, bottom, black)
	vline(img, left, top, bottom, black)
	text(img, (left+right)/2-textWidth(p.XLabel)/2, bottom+45, p.XLabel, black)
	text(img, left-60, top-12, p.YLabel, black)
	text(img, (p.Width-textWidth(p.Title))/2, 24, p.Title, black)

	// The steps.
	for _, s := range p.Series {
		xs := slices.Clone(s.Xs)
		slices.Sort(xs)
		n := float64(len(xs))
		prevY := 0.0
		for i, x := range xs {
			y := float64(i+1) / n
			line(img, px(x), py(prevY), px(x), py(y), s.Color, s.Dashed)
			if i+1 < len(xs) {
				line(img, px(x), py(y), px(xs[i+1]), py(y), s.Color, s.Dashed)
			}
			dot(img, px(x), py(y), s.Color)
			prevY = y
		}
	}

	// Legend.
	lx, ly := right+25, top+10
	for i, s := range p.Series {
		y := ly + 24*i
		line(img, lx, y-4, lx+36, y-4, s.Color, s.Dashed)
		dot(img, lx+18, y-4, s.Color)
		text(img, lx+44, y, fmt.Sprintf("%s (n=%d)", s.Label, len(s.Xs)), black)
	}
	return img
}

func msLabel(x float64) string {
	switch {
	case x >= 1000:
		return fmt.Sprintf("%g s", x/1000)
	default:
		return fmt.Sprintf("%g ms", x)
	}
}

func textWidth(s string) int { return font.MeasureString(basicfont.Face7x13, s).Ceil() }

func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	d := font.Drawer{Dst: img, Src: &image.Uniform{c}, Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws a 3-pixel-wide axis-parallel or diagonal segment; dashed lines skip
// every other 6 pixels.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool) {
	dx, dy := x1-x0, y1-y0
	steps := max(abs(dx), abs(dy))
	for i := 0; i <= steps; i++ {
		if dashed && (i/6)%2 == 1 {
			continue
		}
		x, y := x0, y0
		if steps > 0 {
			x, y = x0+dx*i/steps, y0+dy*i/steps
		}
		for o := -1; o <= 1; o++ {
			if abs(dx) >= abs(dy) {
				img.SetRGBA(x, y+o, c)
			} else {
				img.SetRGBA(x+o, y, c)
			}
		}
	}
}

func dot(img *image.RGBA, x, y int, c color.RGBA) {
	fill(img, image.Rect(x-3, y-3, x+4, y+4), c)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// Loaded into kaleido's page after plotly.js (core/figures/slides.py). Plotly.toImage draws a
// figure into a div that is not in the document, where text has no size, so automargin grows
// no margin; and even in the document plotly settles its margins only over the several redraws
// a page makes on screen (one component's push at a time: with the legend at the bottom, the
// title's push was lost). Exports drew the plot area over the title, clipped the first subplot
// title and put the legend over the x axis's labels.
//
// This draws the figure in an attached, hidden div of the export's size, then measures what it
// drew and grows margins until (1) every text lies inside the canvas, (2) the legend overlaps
// no other text and (3) no axis title had to be pulled in for want of room, redrawing after each change (a few passes), and returns that div's own image
// (SVG or PNG); other formats go to plotly's toImage.
(function () {
  const toImage = Plotly.toImage;

  function box(el, origin) {
    const r = el.getBoundingClientRect();
    return { l: r.left - origin.left, t: r.top - origin.top, r: r.right - origin.left, b: r.bottom - origin.top,
             w: r.width, h: r.height };
  }

  function overlap(a, b) {
    return Math.min(a.r, b.r) - Math.max(a.l, b.l) > 1 && Math.min(a.b, b.b) - Math.max(a.t, b.t) > 1;
  }

  // how much more margin each side needs for what is drawn now
  function needs(gd, width, height, titleGap) {
    const origin = gd.getBoundingClientRect();
    const legend = gd.querySelector(".legend");
    const lb = legend ? box(legend, origin) : null;
    const more = { l: 0, r: 0, t: 0, b: 0 };
    for (const el of gd.querySelectorAll("svg text")) {
      if (!el.textContent.trim() || (legend && legend.contains(el))) continue;
      const b = box(el, origin);
      if (b.w === 0 || b.h === 0) continue;
      more.t = Math.max(more.t, -b.t);
      more.l = Math.max(more.l, -b.l);
      more.r = Math.max(more.r, b.r - width);
      more.b = Math.max(more.b, b.b - height);
      if (lb && overlap(lb, b)) {
        // the legend sits at the bottom: lift the plot (and its axis labels) above it
        more.b = Math.max(more.b, b.b - lb.t + 4);
      }
    }
    const title = gd.querySelector(".g-gtitle");
    if (title && title.textContent.trim()) {
      const tb = box(title, origin);
      more.t = Math.max(more.t, tb.b + titleGap - gd._fullLayout._size.t);
    }
    // an axis title plotly had to pull in because the margin was short (it says by how much)
    for (const g of gd.querySelectorAll("g[class^='g-x'][class$='title'], g[class^='g-y'][class$='title']")) {
      const m = /translate\(\s*(-?[\d.]+)[ ,]+(-?[\d.]+)\s*\)/.exec(g.getAttribute("transform") || "");
      if (!m || !g.textContent.trim()) continue;
      const dx = parseFloat(m[1]), dy = parseFloat(m[2]);
      if (dy < 0) more.b = Math.max(more.b, -dy);
      if (dy > 0) more.t = Math.max(more.t, dy);
      if (dx > 0) more.l = Math.max(more.l, dx);
      if (dx < 0) more.r = Math.max(more.r, -dx);
    }
    for (const k of Object.keys(more)) more[k] = Math.ceil(more[k] > 0.5 ? more[k] + 2 : 0);
    return more;
  }

  // the figure's title hung from the canvas's top instead of standing on the plot area: plotly
  // stands a title of several lines on its first line, so the others fell into the plot; the room
  // it kept below itself (for subplot titles) is kept as a gap (needs() keeps it clear)
  function hungTitle(layout) {
    const t = layout.title;
    if (!t || !t.text || t.yref === "container") return [layout, 0];
    const lines = (t.text.match(/<br>/gi) || []).length + 1;
    const size = (t.font && t.font.size) || 1.4 * ((layout.font && layout.font.size) || 12);
    const line = Math.round(1.3 * size);
    const pad = t.pad || {};
    const title = Object.assign({}, t, { yref: "container", y: 1, yanchor: "top", automargin: false,
                                         pad: { t: 8 + Math.floor(line * (lines - 1) / 2), l: pad.l || 0, r: 0, b: 0 } });
    return [Object.assign({}, layout, { title: title }), (pad.b || 0)];
  }

  Plotly.toImage = async function (fig, opts) {
    const fmt = opts && opts.format;
    if (!(fig && fig.data && !(fig instanceof HTMLElement) && opts.width && opts.height && (fmt === "svg" || fmt === "png"))) {
      return toImage.call(this, fig, opts);
    }
    const gd = document.createElement("div");
    gd.style.position = "absolute";
    gd.style.left = "-20000px";
    gd.style.top = "0px";
    document.body.appendChild(gd);
    try {
      const config = Object.assign({}, fig.config, { staticPlot: true });
      const [hung, titleGap] = hungTitle(fig.layout);
      fig = Object.assign({}, fig, { layout: hung });
      let layout = Object.assign({}, fig.layout, { width: opts.width, height: opts.height });
      await Plotly.newPlot(gd, fig.data, layout, config);
      const s = gd._fullLayout._size;
      let margin = { l: s.l, r: s.r, t: s.t, b: s.b, pad: s.p };
      for (let pass = 0; pass < 6; pass++) {
        layout = Object.assign({}, fig.layout, { width: opts.width, height: opts.height, margin: margin });
        await Plotly.newPlot(gd, fig.data, layout, config);
        const more = needs(gd, opts.width, opts.height, titleGap);
        if (!(more.l || more.r || more.t || more.b)) break;
        const z = gd._fullLayout._size;       // as plotly grew them this pass, then what is still needed
        margin = Object.assign({}, margin, { l: z.l + more.l, r: z.r + more.r, t: z.t + more.t, b: z.b + more.b });
      }
      // the image of this div as drawn (plotly's own toImage would draw it again, detached, and
      // place axis titles as if tick labels had no size)
      const scale = opts.scale || 1;
      const svg = Plotly.Snapshot.toSVG(gd, fmt, scale);
      if (fmt === "svg") return opts.imageDataOnly ? svg : "data:image/svg+xml," + encodeURIComponent(svg);
      const url = await Plotly.Snapshot.svgToImg({ format: fmt, width: opts.width * scale, height: opts.height * scale,
                                                   canvas: document.createElement("canvas"), svg: svg,
                                                   promise: true });
      return opts.imageDataOnly ? url.replace(/^data:image\/png;base64,/, "") : url;
    } finally {
      Plotly.purge(gd);
      gd.remove();
    }
  };
})();

// The result page works without this script: it only adds copy buttons to the launch
// commands and shows a plot point's figures below the plot on hover or click (its
// <title> is the browser's own tooltip without it).
"use strict";
document.querySelectorAll("pre.command").forEach((pre) => {
  const b = document.createElement("button");
  b.type = "button"; b.className = "copy"; b.textContent = "Copy";
  b.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(pre.textContent); b.textContent = "Copied"; }
    catch (e) {
      const r = document.createRange(); r.selectNodeContents(pre);
      getSelection().removeAllRanges(); getSelection().addRange(r); b.textContent = "Selected";
    }
  });
  pre.before(b);
});
const tip = document.getElementById("tip");
document.querySelectorAll("#pareto [data-point]").forEach((p) => {
  const show = () => { tip.textContent = p.querySelector("title").textContent; };
  p.addEventListener("mouseenter", show); p.addEventListener("click", show);
});

// The list's "select all on this page" box, and a confirmation before an action is sent.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const toggle = document.getElementById("action-toggle");
  const boxes = () => document.querySelectorAll("input.action-select");
  if (toggle) {
    toggle.addEventListener("change", () => boxes().forEach((b) => { b.checked = toggle.checked; }));
  }
  const form = document.getElementById("changelist-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      const select = form.querySelector("select[name=action]");
      const label = select ? select.options[select.selectedIndex].text : "";
      const n = Array.from(boxes()).filter((b) => b.checked).length;
      if (!window.confirm(`${label}: ${n} selected?`)) { event.preventDefault(); }
    });
  }
});
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".delayq-actions form").forEach((form) => {
    form.addEventListener("submit", (event) => {
      const button = form.querySelector("input[type=submit]");
      if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) {
        event.preventDefault();
      }
    });
  });
});

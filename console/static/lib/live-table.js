// Re-rendering a live table every second must not throw away the keyboard user's place:
// remember the focused link by its href and put focus back on the same link afterwards.

export function keepFocus(container, rebuild) {
  const active = document.activeElement;
  const href = active && container.contains(active) ? active.getAttribute("href") : null;
  rebuild();
  if (href) {
    const again = [...container.querySelectorAll("a[href]")].find((a) => a.getAttribute("href") === href);
    if (again) again.focus();
  }
}

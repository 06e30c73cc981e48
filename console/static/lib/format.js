// How numbers read on screen: one place, so every page says "98.2 %" the same way.

const DASH = "—";

export function percent(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return DASH;
  const scaled = value * 100;
  return `${scaled >= 99.95 && scaled < 100 ? scaled.toFixed(2) : scaled.toFixed(digits)} %`;
}

export function ms(value) {
  if (value === null || value === undefined) return DASH;
  if (value >= 10000) return `${(value / 1000).toFixed(1)} s`;
  if (value >= 1000) return `${(value / 1000).toFixed(2)} s`;
  return `${value >= 100 ? Math.round(value) : value.toFixed(1)} ms`;
}

export function count(value) {
  if (value === null || value === undefined) return DASH;
  return Number(value).toLocaleString("en-US");
}

// A cost in the prices' own (unit-free) units: up to 4 significant decimals, no currency sign.
export function cost(value) {
  if (value === null || value === undefined) return DASH;
  return Number(value).toLocaleString("en-US", { maximumSignificantDigits: 4 });
}

export function rate(value) {
  if (value === null || value === undefined) return DASH;
  return value >= 100 ? Math.round(value).toLocaleString("en-US") : value.toFixed(value >= 10 ? 1 : 2);
}

export function age(msAgo) {
  if (msAgo === null || msAgo === undefined) return "never";
  const seconds = msAgo / 1000;
  if (seconds < 1) return "just now";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

export function clock(epochSeconds, withSeconds = false) {
  if (!epochSeconds) return DASH;
  const options = { hour: "2-digit", minute: "2-digit", hour12: false };
  if (withSeconds) options.second = "2-digit";
  return new Date(epochSeconds * 1000).toLocaleTimeString("en-GB", options);
}

export function dateTime(epochSeconds) {
  if (!epochSeconds) return DASH;
  return new Date(epochSeconds * 1000).toLocaleString("en-GB", { hour12: false });
}

export function hourLabel(epochSeconds) {
  const d = new Date(epochSeconds * 1000);
  return `${d.toLocaleDateString("en-GB", { day: "2-digit", month: "short" })} ${d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", hour12: false })}`;
}

export function load(value) {
  return value === null || value === undefined ? DASH : `${Math.round(value * 100)} %`;
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export { DASH };

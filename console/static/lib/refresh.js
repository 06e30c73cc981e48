// Pages that fetch their own data refresh on the live feed's ticks, one fetch at a time.

export function refreshOnTick(live, refresh, everyTicks = 1) {
  let busy = false;
  let ticks = 0;
  return live.on("overview", async () => {
    if (busy || ticks++ % everyTicks) return;
    busy = true;
    try { await refresh(); } finally { busy = false; }
  });
}

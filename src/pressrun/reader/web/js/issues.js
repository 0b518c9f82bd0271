// Which issues there are: the balancer's /v1/origins lists every origin with the
// issues it holds (docs/balancer.md); the union over the origins that are up is
// what a reader can download. Used by the app when it opens and by the service
// worker's periodic sync (sw.js).

import { allRecords, getSetting, putSetting } from "./db.js";

/** The issue ids the balancer's origins hold now (sorted); `balancerUrl` may be a
 * list of balancers, asked in turn until one answers (issue 30). */
export async function availableIssues(balancerUrl, signal = undefined) {
  const urls = Array.isArray(balancerUrl) ? balancerUrl : [balancerUrl];
  let doc = null;
  let last = null;
  for (const url of urls) {
    try {
      const resp = await fetch(`${url}/v1/origins`, { cache: "no-store", signal });
      if (!resp.ok) throw new Error(`the balancer at ${url} answered HTTP ${resp.status} to /v1/origins`);
      doc = await resp.json();
      break;
    } catch (err) {
      if (signal?.aborted) throw err;
      last = err;
    }
  }
  if (doc === null) throw last;
  const ids = new Set();
  for (const origin of doc.origins ?? []) {
    if (origin.state !== "up") continue;
    for (const id of origin.status?.issues ?? []) ids.add(id);
  }
  return [...ids].sort();
}

/**
 * The issues out since the last check: available, not in the library, not seen
 * before. Each is reported once (they are recorded as seen).
 */
export async function checkNewIssues(balancerUrl, signal = undefined) {
  const available = await availableIssues(balancerUrl, signal);
  const seen = new Set(await getSetting("seen_issues", []));
  const library = new Set((await allRecords("issues")).map((r) => r.issue_id));
  const fresh = available.filter((id) => !seen.has(id) && !library.has(id));
  await putSetting("seen_issues", [...new Set([...seen, ...available])].sort());
  await putSetting("last_check_at", Date.now());
  return { available, fresh };
}

// A class split over modules (swarm.js's SwarmFetch, download.js's Download): the
// methods written in a part's own module, as a class of methods only, are put on the
// class's prototype, so `this` is the instance and they read and write its fields.

/** Put every method of each of `parts` (classes) on `target`'s prototype. */
export function mixIn(target, ...parts) {
  for (const part of parts) {
    for (const name of Object.getOwnPropertyNames(part.prototype)) {
      if (name !== "constructor") Object.defineProperty(target.prototype, name, Object.getOwnPropertyDescriptor(part.prototype, name));
    }
  }
}

// The two DOM helpers of the app's views: `$` (one element by selector) and
// `element` (a new element with properties and children).

export const $ = (selector) => document.querySelector(selector);

export function element(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  Object.assign(el, props);
  for (const c of children) if (c !== null) el.append(c);
  return el;
}

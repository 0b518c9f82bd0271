// The settings view: Wi-Fi only, automatic downloads, sharing with other readers, the
// reader's key (shown, copied or shared), and one subscription on several devices
// (linking codes and key files: link.js).
//
// app.js calls setUpSettings once ({state, hooks, checkForIssues}): `state` is the
// app's (this view sets shareUploads and notSubscribed), `hooks` its window.pressrun
// (linked, linkCode and linkError are this view's), `checkForIssues` its new-issue
// check, run again once this device holds a subscriber key. window.pressrun.acceptLink
// goes through linkAction.

import { getSetting, putSetting } from "./db.js";
import { $ } from "./dom.js";
import { LinkError, acceptLink, importKeyFile, normalCode, offerLink } from "./link.js";
import { notice } from "./notices.js";
import { subscriberPublicKey } from "./subscription.js";

let state = null;
let hooks = {};
let checkForIssues = async () => {};

/** Wire the settings view to the app's state, hooks and new-issue check (see above). */
export async function setUpSettings({ state: appState, hooks: appHooks, checkForIssues: check }) {
  state = appState;
  hooks = appHooks;
  checkForIssues = check;
  const wifi = $("#wifi-only");
  const auto = $("#auto-download");
  const share = $("#share-uploads");
  wifi.checked = await getSetting("wifi_only", true);
  auto.checked = await getSetting("auto_download", true);
  share.checked = state.shareUploads = await getSetting("share_uploads", true);
  share.onchange = async () => {
    state.shareUploads = share.checked;
    await putSetting("share_uploads", share.checked);
  };
  wifi.onchange = async () => {
    await putSetting("wifi_only", wifi.checked);
    window.dispatchEvent(new Event("pressrun-settings"));
  };
  auto.onchange = () => putSetting("auto_download", auto.checked);
  $("#connection").textContent = navigator.connection?.type
    ? `This connection: ${navigator.connection.type}`
    : "This browser does not say whether the connection is Wi-Fi; downloads go ahead.";
  $("#settings-button").onclick = async () => {
    $("#settings-view").hidden = !$("#settings-view").hidden;
    // the key (libsodium.js, 430 KB, and a key pair made on first use) when first shown
    if (!$("#settings-view").hidden && !$("#subscription").dataset.key) showKey(await subscriberPublicKey());
  };
  $("#check-now").onclick = () => checkForIssues();
  setUpLinking();
  $("#copy-key").onclick = async () => {
    const key = $("#subscription").dataset.key;
    // the key goes to the publisher by whatever way the reader talks to them
    try {
      if (navigator.share) await navigator.share({ title: "My pressrun reader key", text: key });
      else await navigator.clipboard.writeText(key);
      $("#copy-key").textContent = navigator.share ? "Shared" : "Copied";
    } catch (err) {
      if (err?.name !== "AbortError") {
        const range = document.createRange();
        range.selectNodeContents($("#subscriber-key"));
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        $("#copy-key").textContent = "Selected: copy it";
      }
    }
  };
}

function showKey(key) {
  $("#subscriber-key").textContent = key;
  $("#subscription").dataset.key = key;
}

// -- one subscription on several devices (link.js)

function linkStatus(text, { error = false, detail = null } = {}) {
  const status = $("#link-status");
  status.textContent = text;
  status.classList.toggle("error", error);
  if (detail) status.title = detail;
}

/** This device now holds the subscriber key `key` (linked or imported). */
async function keyChanged(key) {
  showKey(key);
  state.notSubscribed = false;
  for (const old of document.querySelectorAll('#notices .notice[data-key="subscribe"]')) old.remove();
  linkStatus(`This device now uses your subscription (key ${key.slice(0, 8)}…).`);
  $("#link-status").scrollIntoView({ block: "nearest" });
  notice("This device now uses your subscription: your issues download here.", { kind: "new", key: "subscribe" });
  hooks.linked = key;
  await checkForIssues();
}

export async function linkAction(action) {
  try {
    await keyChanged(await action());
  } catch (err) {
    const said = err instanceof LinkError ? err.message : "That did not work. Try again.";
    linkStatus(said, { error: true, detail: err.detail ?? err.message });
    hooks.linkError = said;
  }
}

function setUpLinking() {
  $("#link-offer").onclick = async () => {
    $("#link-offer").disabled = true;
    linkStatus("Making a code…");
    try {
      const offer = await offerLink();
      $("#link-code").textContent = offer.shown;
      $("#link-offered").hidden = false;
      linkStatus("");
      hooks.linkCode = offer.shown;
      $("#link-share").onclick = async () => {
        // the code travels in the link's #fragment, which no server ever receives
        const url = `${location.origin}${location.pathname}#link=${offer.code}`;
        try {
          if (navigator.share) await navigator.share({ title: "Open my pressrun subscription", url });
          else await navigator.clipboard.writeText(url);
          $("#link-share").textContent = navigator.share ? "Shared" : "Link copied";
        } catch (err) {
          if (err?.name !== "AbortError") linkStatus("Could not share the link: type the code instead.", { error: true });
        }
      };
    } catch (err) {
      const said = err instanceof LinkError ? err.message : "Could not make a code. Try again.";
      $("#link-offered").hidden = true; // a code shown before is spent or stale
      linkStatus(said, { error: true, detail: err.detail ?? err.message });
      hooks.linkError = said;
    } finally {
      $("#link-offer").disabled = false;
    }
  };
  const accept = () => linkAction(() => acceptLink($("#link-input").value));
  $("#link-accept").onclick = accept;
  $("#link-input").onkeydown = (e) => {
    if (e.key === "Enter") accept();
  };
  $("#key-file").onchange = async () => {
    const file = $("#key-file").files[0];
    if (!file) return;
    if (file.size > 1024) {
      linkStatus("That file is not a reader key (it is too big): choose reader.key.", { error: true });
      return;
    }
    await linkAction(async () => importKeyFile(file.name, await file.text()));
    $("#key-file").value = "";
  };
  // opened from a shared link (…#link=CODE): the code is filled in, never sent anywhere
  const fromLink = /^#link=(.+)$/.exec(location.hash);
  if (fromLink && normalCode(decodeURIComponent(fromLink[1]))) {
    history.replaceState(null, "", location.pathname + location.search);
    $("#link-input").value = normalCode(decodeURIComponent(fromLink[1]));
    $("#settings-view").hidden = false;
    linkStatus("Tap Use code to open your subscription on this device.");
  }
}

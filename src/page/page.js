// Refreshes the view from this server only, every few seconds; sends the API key, when the user gave one,
// as a Bearer header. The key lives in this tab's sessionStorage: never in a URL, a cookie or on disk.
(function () {
  "use strict";
  var KEY = "hearth-api-key";
  var view = document.getElementById("view");
  var login = document.getElementById("login");
  var forget = document.getElementById("forget");
  var refreshed = document.getElementById("refreshed");

  function headers(extra) {
    var h = Object.assign({}, extra || {});
    var key = sessionStorage.getItem(KEY);
    if (key) { h["Authorization"] = "Bearer " + key; }
    return h;
  }

  function showLogin(message) {
    login.hidden = false;
    view.innerHTML = "";
    document.getElementById("login-error").textContent = message || "";
  }

  function refresh() {
    return fetch("/page/view", { headers: headers(), cache: "no-store", credentials: "omit" })
      .then(function (r) {
        if (r.status === 401) {
          var had = sessionStorage.getItem(KEY);
          sessionStorage.removeItem(KEY);
          showLogin(had ? "That key was refused." : "");
          return;
        }
        return r.text().then(function (body) {
          if (!r.ok) { refreshed.textContent = "refresh failed: " + r.status + " " + body; return; }
          // The fragment is this server's own rendering, every value in it escaped there.
          view.innerHTML = body;
          login.hidden = true;
          forget.hidden = !sessionStorage.getItem(KEY);
          refreshed.textContent = "updated " + new Date().toLocaleTimeString();
        });
      })
      .catch(function (e) { refreshed.textContent = "refresh failed: " + e; });
  }

  login.addEventListener("submit", function (ev) {
    ev.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById("key").value.trim());
    document.getElementById("key").value = "";
    refresh();
  });

  forget.addEventListener("click", function (ev) {
    ev.preventDefault();
    sessionStorage.removeItem(KEY);
    showLogin("");
    forget.hidden = true;
  });

  // The rollback button: a JSON POST, so the control port's access rules (Origin, content type, key) apply.
  view.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-action=rollback]");
    if (!button) { return; }
    // A per-user row's button rolls back that user's own chain.
    var user = button.getAttribute("data-user");
    if (!window.confirm(user ? "Roll back user " + user + " to the state served before this one?"
                             : "Roll back to the state served before this one?")) { return; }
    button.disabled = true;
    fetch("/deltas/rollback", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(user ? { user: user } : {}),
      credentials: "omit"
    })
      .then(function (r) { return r.json().then(function (j) { return [r, j]; }); })
      .then(function (rj) {
        // Outside the view, so the next refresh does not wipe it.
        document.getElementById("notice").textContent = rj[0].ok
          ? "Rollback: " + rj[1].message
          : "Rollback refused: " + (rj[1].error && rj[1].error.message || rj[0].status);
        setTimeout(refresh, 1500);
      })
      .catch(function (e) { button.disabled = false; refreshed.textContent = "rollback failed: " + e; });
  });

  // With a key set the page arrives without data: fetch it at once if this tab already has the key.
  if (document.body.dataset.keyed === "true" && sessionStorage.getItem(KEY)) { refresh(); }
  setInterval(function () {
    if (login.hidden || sessionStorage.getItem(KEY)) { refresh(); }
  }, 5000);
})();

// The New task and Edit forms' live preview: as the fields change, the form is posted to
// /task-preview (a dry run of put_task, with the CSRF token) and the answer, an HTML fragment,
// replaces the preview; an error in it is shown beside its field. Without this script the
// form's Preview button does the same with a full page.
(function () {
  "use strict";
  var form = document.getElementById("task-form");
  if (!form) return;
  var timer = null;
  var asked = 0;

  function show(html) {
    var holder = document.getElementById("task-preview");
    if (!holder) return;
    var box = document.createElement("div");
    box.innerHTML = html;
    var fresh = box.querySelector("#task-preview");
    if (!fresh) return;
    var errors = fresh.querySelectorAll(".preview-errors li");
    holder.replaceWith(fresh);
    var marks = form.querySelectorAll(".field-error");
    for (var i = 0; i < marks.length; i++) {
      marks[i].textContent = "";
      marks[i].parentNode.classList.remove("invalid");
    }
    for (var j = 0; j < errors.length; j++) {
      var where = document.getElementById("err-" + errors[j].getAttribute("data-field"));
      if (where) {
        where.textContent = errors[j].textContent;
        where.parentNode.classList.add("invalid");
      }
    }
  }

  function ask() {
    var mine = ++asked;
    fetch(form.getAttribute("data-preview"), {
      method: "POST",
      body: new FormData(form),
      credentials: "same-origin",
      cache: "no-store",
    })
      .then(function (response) { return response.text(); })
      .then(function (html) { if (mine === asked) show(html); })
      .catch(function () {});
  }

  function soon() {
    window.clearTimeout(timer);
    timer = window.setTimeout(ask, 300);
  }

  form.addEventListener("input", soon);
  form.addEventListener("change", soon);
})();

;;; eglot_check.el --- check the specd configuration loaded by Emacs  -*- lexical-binding: t -*-
;;
;;   emacs --batch -l init.el -l scripts/editors/eglot_check.el FILE.py
;;
;; Opens FILE.py (so the init file's python-mode-hook runs), runs the hooks a command loop
;; would run (batch mode has none, and eglot-ensure waits for it), waits for eglot to
;; connect, types "(" at the end of the file, asks completion-at-point and
;; textDocument/inlineCompletion there, and prints one JSON line:
;;   {"emacs": VERSION, "attached": BOOL, "completion": TEXT, "inline": TEXT}
(require 'json)
;; An interactive start activates installed packages (eglot on Emacs 28) before the init
;; file runs; batch mode does not.
(require 'package)
(package-activate-all)
;; The first answer waits for the model to load: give a busy machine time (default 10 s).
(require 'jsonrpc)
(setq jsonrpc-default-request-timeout 120)
(defvar specd-check-result (list (cons "emacs" emacs-version)))
(defun specd-check-put (key value) (push (cons key value) specd-check-result))
(defun specd-check-finish ()
  (princ (concat (json-encode specd-check-result) "\n"))
  (kill-emacs 0))
(find-file (car command-line-args-left))
(setq command-line-args-left nil)
(run-hooks 'post-command-hook)
(let ((deadline (+ (float-time) 120)))
  (while (and (not (and (fboundp 'eglot-current-server) (eglot-current-server)))
              (< (float-time) deadline))
    (accept-process-output nil 0.1)
    (run-hooks 'post-command-hook)))
(let ((server (and (fboundp 'eglot-current-server) (eglot-current-server))))
  (specd-check-put "attached" (if server t :json-false))
  (unless server (specd-check-finish))
  (goto-char (point-max))
  (insert "(")
  (eglot--signal-textDocument/didChange)
  (let* ((capf (eglot-completion-at-point))
         (cands (and capf (all-completions "" (nth 2 capf)))))
    (specd-check-put "completion" (if cands (substring-no-properties (car cands)) "")))
  (let* ((res (jsonrpc-request server :textDocument/inlineCompletion
                               (append (eglot--TextDocumentPositionParams)
                                       '(:context (:triggerKind 1)))))
         (items (if (vectorp res) res (plist-get res :items)))
         (first (and items (> (length items) 0) (aref items 0))))
    (specd-check-put "inline" (or (and first (plist-get first :insertText)) "")))
  (ignore-errors (eglot-shutdown server))
  (specd-check-finish))

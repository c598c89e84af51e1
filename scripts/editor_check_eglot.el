;;; editor_check_eglot.el --- check specd with Emacs eglot, headless  -*- lexical-binding: t -*-
;;
;;   cd some/git/project && emacs --batch -l /path/to/specd/scripts/editor_check_eglot.el FILE.py
;;
;; Uses the eglot-server-programs entry from docs/editors.md, completes at the end of FILE
;; after typing one character (completion-at-point, applied to the buffer), asks for an
;; inline completion, and prints what came back. SPECD_CMD changes the server command.
(require 'eglot)
(require 'python)
(let ((cmd (split-string (or (getenv "SPECD_CMD") "specd serve --stdio"))))
  (add-to-list 'eglot-server-programs
               `((python-mode python-ts-mode) . (,@cmd :initializationOptions (:max-lines 4)))))
(defun specd-check-say (fmt &rest args) (princ (concat (apply #'format fmt args) "\n")))
(find-file (car command-line-args-left))
(setq command-line-args-left nil)
(python-mode)
(apply #'eglot (eglot--guess-contact))
(let ((deadline (+ (float-time) 120)))
  (while (and (not (eglot-current-server)) (< (float-time) deadline))
    (accept-process-output nil 0.2)))
(let ((server (eglot-current-server)))
  (specd-check-say "connected: %s, inlineCompletionProvider: %s"
                   (and server t) (and (eglot--server-capable :inlineCompletionProvider) t))
  (goto-char (point-max))
  (insert "f")
  (eglot--signal-textDocument/didChange)
  (let* ((t0 (float-time))
         (capf (eglot-completion-at-point))
         (cands (all-completions "" (nth 2 capf))))
    (specd-check-say "completion-at-point (%.0f ms): %S" (* 1000 (- (float-time) t0)) (mapcar #'substring-no-properties cands))
    (when cands
      (completion-in-region (nth 0 capf) (nth 1 capf) (nth 2 capf))
      (specd-check-say "buffer after completing:\n%s" (buffer-string))))
  (specd-check-say "inlineCompletion: %S"
                   (jsonrpc-request server :textDocument/inlineCompletion
                                    (append (eglot--TextDocumentPositionParams) '(:context (:triggerKind 1)))))
  (eglot-shutdown server))
(kill-emacs 0)

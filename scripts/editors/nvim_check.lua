-- Check that the specd configuration loaded by Neovim works: run it after your init.lua.
--
--   nvim --headless -u init.lua -c "luafile scripts/editors/nvim_check.lua" FILE
--
-- Waits for a client named "specd" to attach to FILE's buffer, types "(" at the
-- end of the file (an incremental didChange), asks for textDocument/completion and
-- textDocument/inlineCompletion there, and prints one JSON line:
--   {"nvim": VERSION, "init_error": MESSAGE, "attached": BOOL, "inline": TEXT,
--    "completion": TEXT, ...timings in ms}
-- Runs on Neovim 0.7 and later.
local out = { nvim = tostring(vim.version().major) .. "." .. tostring(vim.version().minor) }
-- An error in the init file (a function this version lacks) leaves its message here.
out.init_error = vim.v.errmsg
local function finish()
  io.stdout:write(vim.fn.json_encode(out) .. "\n")
  vim.cmd("qa!")
end

local function specd_client()
  local get = vim.lsp.get_clients or vim.lsp.get_active_clients
  for _, c in ipairs(get({ bufnr = 0 })) do
    if c.name == "specd" and c.initialized ~= false and c.server_capabilities and next(c.server_capabilities) then
      return c
    end
  end
end

local t0 = vim.loop.hrtime()
vim.wait(120000, function() return specd_client() ~= nil end, 50)
local client = specd_client()
out.attached = client ~= nil
out.attach_ms = math.floor((vim.loop.hrtime() - t0) / 1e6)
if not client then return finish() end
out.inline_provider = client.server_capabilities.inlineCompletionProvider ~= nil

local last = vim.api.nvim_buf_line_count(0)
local width = #vim.api.nvim_buf_get_lines(0, last - 1, last, false)[1]
vim.api.nvim_buf_set_text(0, last - 1, width, last - 1, width, { "(" })
local params = {
  textDocument = { uri = vim.uri_from_bufnr(0) },
  position = { line = last - 1, character = width + 1 },
}

local function ask(method, extra)
  local p = vim.tbl_extend("force", params, extra or {})
  local start = vim.loop.hrtime()
  local res = vim.lsp.buf_request_sync(0, method, p, 120000)
  local ms = math.floor((vim.loop.hrtime() - start) / 1e6)
  local r = res and res[client.id] and res[client.id].result
  return r, ms
end

local list, ms = ask("textDocument/completion", { context = { triggerKind = 1 } })
local item = list and (list.items or list)[1]
out.completion = item and (item.textEdit and item.textEdit.newText or item.insertText or item.label) or ""
out.completion_ms = ms
local inline
inline, ms = ask("textDocument/inlineCompletion", { context = { triggerKind = 1 } })
local first = inline and (inline.items or inline)[1]
out.inline = first and (type(first.insertText) == "table" and first.insertText.value or first.insertText) or ""
out.inline_ms = ms
finish()

-- Check specd with Neovim's built-in LSP client, headless (works from Neovim 0.7).
--
--   cd some/project && nvim --headless -u NONE -c "luafile /path/to/specd/scripts/editor_check_nvim.lua" FILE
--
-- Completes at the end of FILE (inline completion, then a completion item after typing one
-- character, applied to the buffer) and prints what came back. Set SPECD_CMD to change the
-- server command (default: "specd serve --stdio").
local cmd = vim.split(os.getenv("SPECD_CMD") or "specd serve --stdio", " ", { trimempty = true })
local lines = {}
local function say(...) table.insert(lines, table.concat(vim.tbl_map(tostring, { ... }), " ")) end

local id = vim.lsp.start_client({ name = "specd", cmd = cmd, root_dir = vim.fn.getcwd(), init_options = { ["max-lines"] = 4 } })
vim.lsp.buf_attach_client(0, id)
local ready = vim.wait(120000, function()
  local c = vim.lsp.get_client_by_id(id)
  return c ~= nil and c.server_capabilities ~= nil and next(c.server_capabilities) ~= nil
end, 100)
local client = vim.lsp.get_client_by_id(id)
say("attached:", ready, "inlineCompletionProvider:", client and client.server_capabilities.inlineCompletionProvider ~= nil)

local last = vim.api.nvim_buf_line_count(0)
local width = #vim.api.nvim_buf_get_lines(0, last - 1, last, false)[1]
vim.api.nvim_win_set_cursor(0, { last, width })
local params = vim.lsp.util.make_position_params()
params.position.character = width
params.context = { triggerKind = 1 }
local t0 = vim.loop.hrtime()
local res = vim.lsp.buf_request_sync(0, "textDocument/inlineCompletion", params, 120000)
say(string.format("inlineCompletion (%.0f ms):", (vim.loop.hrtime() - t0) / 1e6), vim.inspect(res and res[id] and res[id].result and res[id].result.items))

vim.api.nvim_buf_set_text(0, last - 1, width, last - 1, width, { "f" }) -- one keystroke: an incremental didChange
params = vim.lsp.util.make_position_params()
params.position.character = width + 1
t0 = vim.loop.hrtime()
res = vim.lsp.buf_request_sync(0, "textDocument/completion", params, 120000)
local list = res and res[id] and res[id].result
local item = list and list.items and list.items[1]
say(string.format("completion (%.0f ms):", (vim.loop.hrtime() - t0) / 1e6), item and item.textEdit.newText)
if item then vim.lsp.util.apply_text_edits({ item.textEdit }, 0, "utf-16") end
say("buffer after accepting:\n" .. table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n"))
local stats = vim.lsp.buf_request_sync(0, "specd/stats", nil, 10000)[id].result
say("specd/stats: requests", stats.requests, "completed", stats.completed, "prefix-cache hit rate", stats.prefix_cache.hit_rate)
io.stdout:write(table.concat(lines, "\n") .. "\n")
vim.lsp.stop_client(id)
vim.wait(1000)
vim.cmd("qa!")

/**
 * What a notebook gets back on each connection to its klbr kernel: the recorded outputs put into their
 * cells, the cells still running or queued followed, records whose ids changed on load matched by their
 * code, and a notice of what was done. `logic.ts` decides; this carries it out on the notebook.
 */

import { Notification } from '@jupyterlab/apputils';
import type { NotebookPanel } from '@jupyterlab/notebook';

import { codeCell, pageCells, putRecord } from './cells';
import { KlbrComm } from './comm';
import { Following } from './following';
import { IPlan, IRecord, matchByCode, notice, plan } from './logic';
import { notebookName, tellRestored } from './notebook';

export class Restore {
  constructor(
    private readonly _panel: NotebookPanel,
    private readonly _following: Following
  ) {}

  /** Restored cells so far (the tests read this through the DOM's data attributes as well). */
  get restored(): number {
    return this._restored;
  }

  /** Restore on a fresh comm; `first` (this page's first connection) also looks at earlier sessions. */
  async run(comm: KlbrComm, first: boolean): Promise<void> {
    const page = pageCells(this._panel.content);
    let result: IPlan | null = null;
    // Carried out as the last chunk is handled, so the pushes after it find their cells followed.
    await comm.cells({ cell_ids: page.map(c => c.id), follow: true, previous_sessions: first }, answer => {
      result = plan(page, answer);
      this._carryOut(comm, result);
    });
    if (result === null) {
      return;
    }
    let done: IPlan = result;
    if (done.unmatched.length > 0) {
      // Ids that changed on load (nbformat 4.4): the records may still match cells by their code.
      const taken = new Set([...done.restore, ...done.edited].map(r => r.cellId));
      const extra = await comm.cells({ record_ids: done.unmatched.map(u => u.record_id) });
      const byCode = matchByCode(pageCells(this._panel.content), extra.records, taken);
      if (byCode.size > 0) {
        const more = plan(pageCells(this._panel.content), { ...extra, records: [], unmatched: done.unmatched, queued: [], following: [] }, byCode);
        this._carryOut(comm, more);
        done = { ...done, restore: [...done.restore, ...more.restore], edited: [...done.edited, ...more.edited], unmatched: more.unmatched };
      }
    }
    // Their outputs reached this notebook after all: no notice says they did not.
    void tellRestored(comm, done.restore.map(r => r.record.record_id));
    this._notify(done);
  }

  /** Put the recorded outputs of one cell into it, whatever it shows now; false when none is recorded. */
  async replayCell(comm: KlbrComm, cellId: string): Promise<boolean> {
    const answer = await comm.cells({ cell_ids: [cellId] });
    const record = answer.records.find(r => r.cell_id === cellId);
    if (record === undefined) {
      return false;
    }
    this._put(cellId, record);
    return true;
  }

  private _carryOut(comm: KlbrComm, result: IPlan): void {
    for (const { cellId, record } of result.restore) {
      this._put(cellId, record);
    }
    for (const { cellId, msgId } of result.queued) {
      const model = codeCell(this._panel.content, cellId);
      if (model !== null) {
        model.outputs.clear();
        model.executionCount = null;
        model.executionState = 'running';
        this._following.follow(msgId, cellId);
      }
    }
    for (const msgId of result.unfollow) {
      void comm.request('unfollow', { msg_id: msgId }).catch(() => undefined);
    }
    this._restored += result.restore.length;
    this._panel.node.dataset.klbrRestored = String(this._restored);
  }

  private _put(cellId: string, record: IRecord): void {
    const model = codeCell(this._panel.content, cellId);
    if (model === null) {
      return;
    }
    putRecord(model, record);
    if (record.running) {
      this._following.follow(record.msg_id, cellId);
    }
  }

  private _notify(result: IPlan): void {
    const followed = result.queued.length + result.restore.filter(r => r.record.running).length;
    const text = notice(result, followed);
    if (text === null) {
      return;
    }
    const actions: Notification.IAction[] = [];
    if (result.edited.length > 0) {
      actions.push({
        label: 'Apply the recorded outputs',
        caption: 'Put the outputs these cells had when they ran into them, as they are now',
        callback: () => {
          for (const { cellId, record } of result.edited) {
            this._put(cellId, record);
          }
        }
      });
    }
    const kind = result.edited.length > 0 || result.unmatched.length > 0 ? 'warning' : 'info';
    Notification.emit(`${notebookName(this._panel)}: ${text}`, kind, { autoClose: actions.length > 0 ? false : 6000, actions });
    this._panel.node.dataset.klbrNotice = text;
  }

  private _restored = 0;
}

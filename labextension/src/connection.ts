/**
 * One notebook's link to its klbr kernel: on every kernel connection (the notebook opened, the page
 * reloaded, a reconnect after sleep or a network cut) a fresh `klbr` comm asks for the cells that
 * ran, puts their outputs back into their cells and follows the cells still running or queued.
 */

import { Notification } from '@jupyterlab/apputils';
import { CodeCell, ICodeCellModel } from '@jupyterlab/cells';
import * as nbformat from '@jupyterlab/nbformat';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  Assembler,
  IAnswer,
  ICellsChunk,
  IMemory,
  IPageCell,
  IPlan,
  IRecord,
  matchByCode,
  notice,
  plan,
  pushedOutput,
  PROTOCOL
} from './logic';

/** What the kernel says of itself (`hello` and the `state` pushes). */
export interface IKernelState {
  generation: number | null;
  placement: string;
  recording: 'recording' | 'paused' | 'unavailable';
  notebook: string | null;
  kernel_session: string;
  store_session: number | null;
  status: Array<[string, string]>;
  memory?: IMemory | null; // null (or absent, from an older kernel) until a worker here is sampled
}

/** A request the kernel refused: `name` is the protocol's error name. */
export class KlbrError extends Error {
  constructor(
    readonly name: string,
    message: string
  ) {
    super(message);
  }
}

type Data = Record<string, unknown>;

interface IPending {
  resolve: (data: Data) => void;
  reject: (error: Error) => void;
  assembler?: Assembler;
  onAnswer?: (answer: IAnswer) => void;
}

export class KlbrConnection {
  constructor(readonly panel: NotebookPanel) {
    panel.sessionContext.kernelChanged.connect(this._attach, this);
    void panel.sessionContext.ready.then(() => this._attach());
    panel.disposed.connect(() => this._closeComm());
    // A reload: what the kernel follows for this page stops now, not when those cells end.
    window.addEventListener('pagehide', () => this._closeComm());
  }

  /** The kernel's state, once a klbr kernel has said hello; null for other kernels. */
  get state(): IKernelState | null {
    return this._state;
  }

  get stateChanged(): ISignal<this, IKernelState | null> {
    return this._stateChanged;
  }

  /** Restored cells so far (the tests read this through the DOM's data attributes as well). */
  get restored(): number {
    return this._restored;
  }

  /** Ask the kernel: one request, its answer's data. */
  request(op: string, fields: Data = {}): Promise<Data> {
    const comm = this._comm;
    if (comm === null || comm.isDisposed) {
      return Promise.reject(new KlbrError('NotConnected', 'no klbr comm is open'));
    }
    const id = `${op}-${++this._counter}`;
    return new Promise<Data>((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
      comm.send({ v: PROTOCOL, id, op, ...fields });
    });
  }

  /** Ask the kernel for its state now (what `%klbr status` shows changes by the second). */
  async hello(): Promise<IKernelState> {
    this._setState((await this.request('hello')) as unknown as IKernelState);
    return this._state!;
  }

  /** Put the recorded outputs of the selected cell into it, whatever it shows now. */
  async replayCell(cellId: string): Promise<boolean> {
    const answer = await this._cells({ cell_ids: [cellId] });
    const record = answer.records.find(r => r.cell_id === cellId);
    if (record === undefined) {
      return false;
    }
    this._apply(cellId, record);
    return true;
  }

  // -- connecting ---------------------------------------------------------------------------------

  private _attach(): void {
    const kernel = this.panel.sessionContext.session?.kernel ?? null;
    if (kernel === this._kernel) {
      return;
    }
    if (this._kernel !== null) {
      this._kernel.connectionStatusChanged.disconnect(this._onConnection, this);
    }
    this._closeComm();
    this._kernel = kernel;
    this._setState(null);
    if (kernel !== null) {
      kernel.connectionStatusChanged.connect(this._onConnection, this);
      if (kernel.connectionStatus === 'connected') {
        void this._connect(kernel);
      }
    }
  }

  private _onConnection(kernel: Kernel.IKernelConnection, status: Kernel.ConnectionStatus): void {
    if (status === 'connected') {
      void this._connect(kernel);
    }
  }

  private async _connect(kernel: Kernel.IKernelConnection): Promise<void> {
    const info = await kernel.info;
    if (info.implementation !== 'klbr' || kernel !== this._kernel || kernel.connectionStatus !== 'connected') {
      return;
    }
    this._upgrade();
    this._closeComm();
    const comm = kernel.createComm('klbr');
    comm.onMsg = msg => this._message(msg);
    comm.onClose = () => {
      if (this._comm === comm) {
        this._comm = null;
      }
    };
    this._comm = comm;
    comm.open({ v: PROTOCOL });
    try {
      await this.hello();
      const first = !this._connectedOnce;
      this._connectedOnce = true;
      await this._restore(first);
    } catch (error) {
      console.warn('klbr: the kernel did not answer the klbr comm', error);
    }
  }

  private _closeComm(): void {
    const comm = this._comm;
    this._comm = null;
    this._following.clear();
    for (const pending of this._pending.values()) {
      pending.reject(new KlbrError('NotConnected', 'the klbr comm closed'));
    }
    this._pending.clear();
    if (comm !== null && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // A kernel connection that is gone cannot send the close; the kernel forgets it anyway.
      }
    }
  }

  /** A 4.4 notebook strips cell ids when saved, so they change on every load: save as 4.5. */
  private _upgrade(): void {
    const model = this.panel.context.model;
    // The shared model's interface says readonly; its implementation (YNotebook) has the setter.
    const shared = model.sharedModel as unknown as { nbformat: number; nbformat_minor: number };
    if (shared.nbformat === 4 && shared.nbformat_minor < 5 && !this._upgraded) {
      this._upgraded = true;
      shared.nbformat_minor = 5;
      Notification.info(
        'klbr upgraded this notebook to nbformat 4.5, which keeps cell ids: save it, and its outputs can be ' +
          'restored into their cells after a reload.',
        { autoClose: 8000 }
      );
    }
  }

  // -- restoring ----------------------------------------------------------------------------------

  private _pageCells(): IPageCell[] {
    const cells: IPageCell[] = [];
    for (const widget of this.panel.content.widgets) {
      if (widget.model.type !== 'code') {
        continue;
      }
      const model = widget.model as ICodeCellModel;
      const future = (widget as CodeCell).outputArea?.future;
      cells.push({
        id: model.id,
        source: model.sharedModel.getSource(),
        outputs: model.outputs.toJSON(),
        executionCount: model.executionCount,
        liveMsgId: future && !future.isDisposed ? future.msg.header.msg_id : null
      });
    }
    return cells;
  }

  private _cells(fields: Data, onAnswer?: (answer: IAnswer) => void): Promise<IAnswer> {
    const comm = this._comm;
    if (comm === null || comm.isDisposed) {
      return Promise.reject(new KlbrError('NotConnected', 'no klbr comm is open'));
    }
    const id = `cells-${++this._counter}`;
    return new Promise<IAnswer>((resolve, reject) => {
      this._pending.set(id, {
        resolve: data => resolve(data as unknown as IAnswer),
        reject,
        assembler: new Assembler(),
        onAnswer
      });
      comm.send({ v: PROTOCOL, id, op: 'cells', ...fields });
    });
  }

  private async _restore(first: boolean): Promise<void> {
    const page = this._pageCells();
    let result: IPlan | null = null;
    // Applied as the last chunk is handled, before the kernel's next message (its pushes) is.
    const answer = await this._cells(
      { cell_ids: page.map(c => c.id), follow: true, previous_sessions: first },
      a => {
        result = plan(page, a);
        this._carryOut(result);
      }
    );
    if (result === null) {
      return;
    }
    let done: IPlan = result;
    if (done.unmatched.length > 0) {
      // Ids that changed on load (nbformat 4.4): the records may still match cells by their code.
      const taken = new Set([...done.restore, ...done.edited].map(r => r.cellId));
      const extra = await this._cells({ record_ids: done.unmatched.map(u => u.record_id) });
      const byCode = matchByCode(this._pageCells(), extra.records, taken);
      if (byCode.size > 0) {
        const more = plan(this._pageCells(), { ...extra, records: [], unmatched: done.unmatched, queued: [], following: [] }, byCode);
        this._carryOut(more);
        done = { ...done, restore: [...done.restore, ...more.restore], edited: [...done.edited, ...more.edited], unmatched: more.unmatched };
      }
    }
    void answer;
    this._notify(done);
  }

  private _carryOut(result: IPlan): void {
    for (const { cellId, record } of result.restore) {
      this._apply(cellId, record);
    }
    for (const { cellId, msgId } of result.queued) {
      const model = this._model(cellId);
      if (model !== null) {
        model.outputs.clear();
        model.executionCount = null;
        model.executionState = 'running';
        this._following.set(msgId, cellId);
      }
    }
    for (const msgId of result.unfollow) {
      void this.request('unfollow', { msg_id: msgId }).catch(() => undefined);
    }
    this._restored += result.restore.length;
    this.panel.node.dataset.klbrRestored = String(this._restored);
  }

  private _apply(cellId: string, record: IRecord): void {
    const model = this._model(cellId);
    if (model === null) {
      return;
    }
    model.outputs.fromJSON(record.outputs as unknown as nbformat.IOutput[]);
    model.executionCount = record.execution_count;
    model.executionState = record.running ? 'running' : 'idle';
    if (record.running) {
      this._following.set(record.msg_id, cellId);
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
            this._apply(cellId, record);
          }
        }
      });
    }
    const kind = result.edited.length > 0 || result.unmatched.length > 0 ? 'warning' : 'info';
    Notification.emit(text, kind, { autoClose: actions.length > 0 ? false : 6000, actions });
    this.panel.node.dataset.klbrNotice = text;
  }

  private _model(cellId: string): ICodeCellModel | null {
    for (const widget of this.panel.content.widgets) {
      if (widget.model.id === cellId && widget.model.type === 'code') {
        return widget.model as ICodeCellModel;
      }
    }
    return null;
  }

  // -- from the kernel ----------------------------------------------------------------------------

  private _message(msg: KernelMessage.ICommMsgMsg): void {
    const data = msg.content.data as Data;
    const id = typeof data.id === 'string' ? data.id : null;
    const pending = id !== null ? this._pending.get(id) : undefined;
    if (data.error !== undefined) {
      const error = data.error as { name: string; message: string };
      console.warn(`klbr: ${error.name}: ${error.message}`);
      if (pending !== undefined && id !== null) {
        this._pending.delete(id);
        pending.reject(new KlbrError(error.name, error.message));
      }
      return;
    }
    switch (data.op) {
      case 'state':
        this._setState(data as unknown as IKernelState);
        return;
      case 'output':
        this._output(data);
        return;
      case 'ended':
        this._ended(data);
        return;
      case 'restart':
        this._setState(data as unknown as IKernelState);
        break;
    }
    if (pending === undefined || id === null) {
      return;
    }
    if (pending.assembler !== undefined) {
      let answer: IAnswer | null;
      try {
        answer = pending.assembler.feed(data as unknown as ICellsChunk);
      } catch (error) {
        this._pending.delete(id);
        pending.reject(error as Error);
        return;
      }
      if (answer === null) {
        return;
      }
      this._pending.delete(id);
      pending.onAnswer?.(answer);
      pending.resolve(answer as unknown as Data);
      return;
    }
    this._pending.delete(id);
    pending.resolve(data);
  }

  private _output(data: Data): void {
    const cellId = this._following.get(String(data.msg_id));
    const model = cellId !== undefined ? this._model(cellId) : null;
    if (model === null) {
      return;
    }
    const output = pushedOutput(String(data.msg_type), (data.content ?? {}) as Record<string, unknown>);
    if (output === null) {
      return;
    }
    if ('output_type' in output) {
      model.outputs.add(output as unknown as nbformat.IOutput);
    } else {
      model.outputs.clear(output.clear);
    }
  }

  private _ended(data: Data): void {
    const msgId = String(data.msg_id);
    const cellId = this._following.get(msgId);
    this._following.delete(msgId);
    const model = cellId !== undefined ? this._model(cellId) : null;
    if (model === null) {
      return;
    }
    model.executionCount = typeof data.execution_count === 'number' ? data.execution_count : null;
    model.executionState = 'idle';
  }

  private _setState(state: IKernelState | null): void {
    if (state !== null && this._state !== null) {
      state = { ...this._state, ...state };
    }
    this._state = state;
    this._stateChanged.emit(state);
  }

  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _counter = 0;
  private _pending = new Map<string, IPending>();
  private _following = new Map<string, string>(); // followed msg_id -> notebook cell id
  private _state: IKernelState | null = null;
  private _stateChanged = new Signal<this, IKernelState | null>(this);
  private _connectedOnce = false;
  private _upgraded = false;
  private _restored = 0;
}

/**
 * A notebook session's link to its kernel: it follows the session's kernel and that kernel's connection
 * status, and on every connection to a klbr kernel (the notebook opened, a kernel change, a reconnect
 * after sleep or a network cut) opens a fresh `klbr` comm, closing the one before. The comm also closes
 * when the page is hidden for good (a reload: what the kernel follows for this page stops now, not when
 * those cells end), and when the link is disposed, which lets go of every signal and DOM listener.
 * No JupyterLab here: the session, kernel and page are narrow ports, so a test stands them in.
 */

import type { JSONObject } from '@lumino/coreutils';
import type { Kernel } from '@jupyterlab/services';
import type { ISignal } from '@lumino/signaling';

import { ICommPort, IPushHandler, KlbrComm } from './comm';
import { PROTOCOL } from './logic';

/** What the link needs of a kernel connection (a `Kernel.IKernelConnection` is one). */
export interface IKernelPort {
  readonly connectionStatus: Kernel.ConnectionStatus;
  readonly connectionStatusChanged: ISignal<unknown, Kernel.ConnectionStatus>;
  readonly info: Promise<{ implementation: string }>;
}

/** What the link needs of a notebook's session (an `ISessionContext` is one). */
export interface ISessionPort<K extends IKernelPort> {
  readonly kernelChanged: ISignal<unknown, unknown>;
  readonly ready: Promise<void>;
  readonly session: { readonly kernel: K | null } | null;
}

/** Where `pagehide` is heard (the window). */
export type IPagePort = Pick<EventTarget, 'addEventListener' | 'removeEventListener'>;

/** Where an open comm's messages go, and who hears that the kernel closed it. */
export interface ICommSink {
  receive(data: JSONObject): void;
  closed(): void;
}

/** Opens the `klbr` comm on a kernel, its messages sent to `sink` (`openKlbrComm` for a real kernel). */
export type CommOpener<K> = (kernel: K, sink: ICommSink) => ICommPort;

/** Who the link tells of its comm, and hands the comm's pushes to. */
export interface ILinkListener extends IPushHandler {
  /** The session's kernel changed (or went): what was known of the old one is void. */
  kernelChanged(): void;
  /** A fresh comm, on a connection to a klbr kernel. */
  opened(comm: KlbrComm): Promise<void>;
  /** The comm closed, by either side: nothing more comes on it. */
  closed(): void;
}

/** The `klbr` comm on a real kernel connection. */
export function openKlbrComm(kernel: Kernel.IKernelConnection, sink: ICommSink): ICommPort {
  const comm = kernel.createComm('klbr');
  comm.onMsg = msg => sink.receive(msg.content.data);
  comm.onClose = () => sink.closed();
  comm.open({ v: PROTOCOL });
  return comm;
}

export class KernelLink<K extends IKernelPort> {
  constructor(
    private readonly _session: ISessionPort<K>,
    private readonly _page: IPagePort,
    private readonly _open: CommOpener<K>,
    private readonly _listener: ILinkListener
  ) {
    _session.kernelChanged.connect(this._attach, this);
    void _session.ready.then(() => this._attach());
    _page.addEventListener('pagehide', this._onPageHide);
  }

  /** The open comm, if the kernel is klbr and connected. */
  get comm(): KlbrComm | null {
    return this._comm;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Close the comm and let go of the session, the kernel and the page. */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._session.kernelChanged.disconnect(this._attach, this);
    this._kernel?.connectionStatusChanged.disconnect(this._onConnection, this);
    this._kernel = null;
    this._page.removeEventListener('pagehide', this._onPageHide);
    this._close();
  }

  private _attach(): void {
    const kernel = this._session.session?.kernel ?? null;
    if (this._disposed || kernel === this._kernel) {
      return;
    }
    this._kernel?.connectionStatusChanged.disconnect(this._onConnection, this);
    this._close();
    this._kernel = kernel;
    this._listener.kernelChanged();
    if (kernel !== null) {
      kernel.connectionStatusChanged.connect(this._onConnection, this);
      if (kernel.connectionStatus === 'connected') {
        void this._connect(kernel);
      }
    }
  }

  private _onConnection(_kernel: unknown, status: Kernel.ConnectionStatus): void {
    if (status === 'connected' && this._kernel !== null) {
      void this._connect(this._kernel);
    }
  }

  private async _connect(kernel: K): Promise<void> {
    const info = await kernel.info;
    if (info.implementation !== 'klbr' || kernel !== this._kernel || kernel.connectionStatus !== 'connected') {
      return;
    }
    this._close();
    const comm: KlbrComm = new KlbrComm(
      this._open(kernel, { receive: data => comm.receive(data), closed: () => this._lost(comm) }),
      this._listener
    );
    this._comm = comm;
    await this._listener.opened(comm);
  }

  /** This side closes the comm (a new connection, a kernel change, the page hidden, disposal). */
  private _close(): void {
    const comm = this._comm;
    this._comm = null;
    comm?.close();
    this._listener.closed();
  }

  /** The kernel closed a comm (it keeps at most 64 per kernel; or it went). */
  private _lost(comm: KlbrComm): void {
    comm.closedByKernel();
    if (this._comm === comm) {
      this._comm = null;
      this._listener.closed();
    }
  }

  private readonly _onPageHide = (): void => this._close();

  private _kernel: K | null = null;
  private _comm: KlbrComm | null = null;
  private _disposed = false;
}
